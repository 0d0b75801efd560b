"""Loads a safetensors checkpoint straight into a `CausalLM` on its target device, at the disk's speed.

The model is built on the meta device (no memory, no random init) and each parameter is replaced
by the tensor read from the checkpoint, so peak memory is one copy of the weights (plus one layer's
projections while they are packed). `random_model` builds the same model with random weights. Names are HF's
own, so a mismatch means the checkpoint and our architecture disagree: that is an error.
"""

import json
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from gpu.config import ModelConfig
from gpu.model import CausalLM
from gpu.safetensors_stream import StoredTensor, read_header, stream_tensors

# Tensors some checkpoints carry that are recomputed, never loaded.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The shard files named by the index, or the single model.safetensors. Other *.safetensors
    files (Mistral repos ship a `consolidated.safetensors` in another naming scheme) are ignored."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"{model_dir} has no model.safetensors or model.safetensors.index.json")


def load_model(model_dir: str | Path, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> CausalLM:
    """Reads the checkpoint's headers, checks them against `config`'s architecture, then streams each
    file onto `device` (gpu.safetensors_stream) with a progress bar in bytes."""
    with torch.device("meta"):
        model = CausalLM(config)
    params = dict(model.named_parameters())  # a tied lm_head.weight is listed once, as the embedding
    contents = {file: read_header(file) for file in checkpoint_files(model_dir)}
    _check_contents(model_dir, config, params, contents)
    wanted = {file: [t for t in stored if t.name in params] for file, stored in contents.items()}
    total = sum(t.end - t.begin for tensors in wanted.values() for t in tensors)  # the bytes to read
    with tqdm(total=total, desc="Loading weights", unit="B", unit_scale=True, disable=None) as progress:
        for file, tensors in wanted.items():
            for stored, tensor in stream_tensors(file, tensors, device, progress.update):
                _set_parameter(model, stored.name, tensor.to(dtype))
    model.tie_weights()
    model = model.to(device).eval()
    model.fuse_projections()
    return model


def _check_contents(
    model_dir: str | Path,
    config: ModelConfig,
    params: dict[str, nn.Parameter],
    contents: dict[Path, list[StoredTensor]],
) -> None:
    """ValueError, before any weight is read, when the checkpoint's tensors are not the model's."""
    found: set[str] = set()
    unexpected: list[str] = []
    for file, stored in contents.items():
        for tensor in stored:
            if tensor.name not in params:
                redundant_head = config.tie_word_embeddings and tensor.name == "lm_head.weight"
                if not redundant_head and not tensor.name.endswith(_IGNORED_SUFFIXES):
                    unexpected.append(tensor.name)
                continue
            if tensor.name in found:
                raise ValueError(f"{tensor.name} is stored twice in the checkpoint in {model_dir}, once in {file.name}")
            expected = tuple(params[tensor.name].shape)
            if tensor.shape != expected:
                raise ValueError(
                    f"{tensor.name} in {file.name} has shape {list(tensor.shape)}, the config implies {list(expected)}"
                )
            found.add(tensor.name)
    missing = sorted(params.keys() - found)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint in {model_dir} does not match {config.architecture}: "
            f"missing {_few(missing)}, unexpected {_few(sorted(unexpected))}"
        )


def random_model(
    config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0, std: float = 0.02
) -> CausalLM:
    """A model of `config`'s shape with normal(0, std) weights (norms at 1), made on `device` directly:
    benchmarks of real shapes need no checkpoint and no host-side copy of the weights."""
    with torch.device("meta"):
        model = CausalLM(config)
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in list(model.named_parameters()):
        tensor = torch.empty(param.shape, dtype=dtype, device=device)
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif name.endswith(".bias"):
            tensor.zero_()
        else:
            tensor.normal_(0.0, std, generator=generator)
        _set_parameter(model, name, tensor)
    model.tie_weights()
    model.rope_inv_freq = model.rope_inv_freq.to(device)
    model.eval()
    model.fuse_projections()
    return model


def _set_parameter(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner_name, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(owner_name), leaf, nn.Parameter(tensor, requires_grad=False))


def _few(names: list[str], limit: int = 8) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
