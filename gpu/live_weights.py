"""The served model's weights by their checkpoint names: where an update writes and what a trainer
reads back.

Every name a Hugging Face checkpoint of the architecture holds maps to a live tensor: fused
projections' parts (q/k/v, gate/up, gpu/model.py `fuse_projections`) are row views of their pack,
and a tied `lm_head.weight` is the embedding itself. Writing into those views changes what the model
computes with no re-packing and no new tensors, so CUDA graphs captured over them stay valid.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from gpu.weight_check import WeightError

# Parameters that exist only as the packs of fused projections: never named by a checkpoint.
_PACKS = ("qkv_weight", "qkv_bias", "gate_up_weight", "gate_up_bias")
TIED_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class TensorSpec:
    """A tensor an update brings, as its header or metadata describes it."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class LiveWeights:
    """`model`'s weights by checkpoint name. A full update must bring every name in `required`; a
    tied head may come too, and writes the embedding."""

    def __init__(self, model: nn.Module) -> None:
        params = dict(model.named_parameters())  # a tied head is listed once, as the embedding
        self._views = {name: p for name, p in params.items() if name.rpartition(".")[2] not in _PACKS}
        self.required = frozenset(self._views)
        head = model.get_submodule("lm_head").weight if TIED_HEAD not in params else None
        self.tied_head = head is not None
        if head is not None:
            self._views[TIED_HEAD] = head

    def names(self) -> Iterable[str]:
        return self._views.keys()

    def check(self, specs: list[TensorSpec], full: bool, convert: bool = False) -> None:
        """WeightError naming the first tensor that cannot be written: an unknown name, one given
        twice, a shape other than the served one, or a dtype other than the served one; with
        `full`, also the names missing. `convert`: a floating-point tensor may come in another
        floating-point dtype and is converted as it is written (a checkpoint saved in float32 for a
        server in bfloat16, as at load time); without it, tensors must come in the served dtype,
        since their bytes are what the trainer's checksum covers."""
        seen: set[str] = set()
        for spec in specs:
            live = self._views.get(spec.name)
            if live is None:
                raise WeightError(f"{spec.name} is not a weight of the served model")
            if spec.name in seen:
                raise WeightError(f"{spec.name} is given twice in one update")
            seen.add(spec.name)
            if spec.shape != tuple(live.shape):
                raise WeightError(f"{spec.name} has shape {list(spec.shape)}, the served weight {list(live.shape)}")
            if spec.dtype != live.dtype and not (convert and spec.dtype.is_floating_point and live.is_floating_point()):
                raise WeightError(
                    f"{spec.name} is {_dtype_name(spec.dtype)}, the served weight {_dtype_name(live.dtype)}; "
                    "send it in the served dtype"
                )
        missing = sorted(self.required - seen)
        if full and missing:
            more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            raise WeightError(f"a full update lacks {', '.join(missing[:8])}{more}")

    def write(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Copies `tensor` (of the checked shape; converted if its floating dtype differs) into the
        live weight on the device's current stream, and returns the live weight."""
        live = self._views[name]
        with torch.no_grad():
            live.copy_(tensor, non_blocking=True)
        return live

    def read(self, name: str) -> torch.Tensor:
        """The live weight itself (a view; not a copy): WeightError if there is none by that name."""
        live = self._views.get(name)
        if live is None:
            raise WeightError(f"{name} is not a weight of the served model")
        return live


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    """A dtype from its name as trainers send it ("bfloat16" or "torch.bfloat16")."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise WeightError(f"{name!r} is not a torch dtype")
    return dtype
