"""A host copy of the model's weights: what a failed update from disk rolls back to, and where the
weights sleep while their device memory is back with the driver.

The copy is per storage, not per parameter: fused projections' parts (q/k/v, gate/up) are views of
their pack and a tied head is the embedding, so each byte is copied once. On CUDA it is pinned
memory. It is taken only when one of its two uses needs it and it is not `current` (the device
weights were written since): copying 16 GB takes about 0.3 s, which a stream of bucketed updates
from a trainer must not pay per bucket. Releasing resizes each storage to nothing and reallocating
resizes it back: every tensor and view the model holds stays the same Python object, only its
device address changes, so whatever captured those addresses (CUDA graphs) must be captured again.
"""

import torch
from torch import nn


def weight_storages(model: nn.Module) -> list[torch.Tensor]:
    """One tensor per distinct storage of the model's parameters, the one covering most of it."""
    by_storage: dict[int, torch.Tensor] = {}
    for tensor in model.parameters():
        key = tensor.untyped_storage().data_ptr()
        if key not in by_storage or tensor.numel() > by_storage[key].numel():
            by_storage[key] = tensor
    return list(by_storage.values())


class HostWeights:
    """The host copy of `model`'s weight storages, allocated on the first `refresh`."""

    def __init__(self, model: nn.Module) -> None:
        self.tensors = weight_storages(model)
        self.sizes = [t.untyped_storage().nbytes() for t in self.tensors]
        self.nbytes = sum(self.sizes)
        self.device = self.tensors[0].device
        self.copies: list[torch.Tensor] | None = None  # [nbytes] uint8 per storage
        self.current = False  # whether the copy holds the device weights as they are

    @property
    def released(self) -> bool:
        return self.tensors[0].untyped_storage().nbytes() == 0

    def refresh(self) -> None:
        """Copies the device weights to the host, after the work queued so far; returns when done."""
        if self.released:
            raise RuntimeError("the device weights are released: nothing to copy")
        if self.copies is None:
            pin = self.device.type == "cuda"
            self.copies = [torch.empty(size, dtype=torch.uint8, pin_memory=pin) for size in self.sizes]
        for copy, tensor in zip(self.copies, self.tensors, strict=True):
            copy.copy_(_bytes_of(tensor), non_blocking=True)
        self._synchronize()
        self.current = True

    def changed(self) -> None:
        """Says the device weights are about to be written: the copy no longer holds them."""
        self.current = False

    def restore(self) -> None:
        """Copies the host copy back over the device weights (reallocating released storages)."""
        if self.copies is None:
            raise RuntimeError("no host copy of the weights was taken")
        self.reallocate()
        for copy, tensor in zip(self.copies, self.tensors, strict=True):
            _bytes_of(tensor).copy_(copy, non_blocking=True)
        self._synchronize()
        self.current = True

    def release(self) -> None:
        """Returns the device storages' memory (to torch's cache; `torch.cuda.empty_cache` gives it
        to the driver). The tensors stay, sized to nothing, until `reallocate` or `restore`; without
        a host copy the weights are dropped, for a full update to fill again."""
        for tensor in self.tensors:
            tensor.untyped_storage().resize_(0)

    def reallocate(self) -> None:
        """Gives released storages device memory again, uninitialised."""
        for tensor, size in zip(self.tensors, self.sizes, strict=True):
            if tensor.untyped_storage().nbytes() == 0:
                tensor.untyped_storage().resize_(size)
                self.current = False

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage under `tensor`, as uint8 [nbytes]."""
    storage = tensor.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage, 0, (storage.nbytes(),))
