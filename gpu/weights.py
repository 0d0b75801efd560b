"""Loads a safetensors checkpoint straight into a `CausalLM` on its target device.

The model is built on the meta device (no memory, no random init) and each parameter is replaced
by the tensor read from the checkpoint, so peak memory is one copy of the weights (plus one layer's
projections while they are packed). `random_model` builds the same model with random weights. Names are HF's
own, so a mismatch means the checkpoint and our architecture disagree: that is an error.
"""

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from gpu.config import ModelConfig
from gpu.model import CausalLM

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
    with torch.device("meta"):
        model = CausalLM(config)
    params = dict(model.named_parameters())  # a tied lm_head.weight is listed once, as the embedding
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file in tqdm(checkpoint_files(model_dir), desc="Loading weights", unit="file", disable=None):
        with safe_open(file, framework="pt", device=str(device)) as f:
            for name in f.keys():
                if name not in params:
                    redundant_head = config.tie_word_embeddings and name == "lm_head.weight"
                    if not redundant_head and not name.endswith(_IGNORED_SUFFIXES):
                        unexpected.append(name)
                    continue
                tensor = f.get_tensor(name)
                if tensor.shape != params[name].shape:
                    raise ValueError(
                        f"{name} in {file.name} has shape {list(tensor.shape)}, the config implies {list(params[name].shape)}"
                    )
                _set_parameter(model, name, tensor.to(dtype))
                loaded.add(name)
    missing = sorted(params.keys() - loaded)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint in {model_dir} does not match {config.architecture}: "
            f"missing {_few(missing)}, unexpected {_few(sorted(unexpected))}"
        )
    model.tie_weights()
    model = model.to(device).eval()
    model.fuse_projections()
    return model


def random_model(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0, std: float = 0.02) -> CausalLM:
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
