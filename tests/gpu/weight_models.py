"""Models and checkpoints for the live-weights tests: a served runner, checkpoints of the same
architecture with other weights, and the logits that tell which weights serve."""

import random
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from gpu.forward_batch import ForwardBatch
from gpu.host_weights import HostWeights
from gpu.runner import ModelRunner
from gpu.safetensors_stream import read_header
from gpu.weight_receiver import WeightReceiver

PROMPT = [random.Random(7).randrange(5, 1000) for _ in range(12)]


def other_weights(model_dir: Path, out_dir: Path, seed: int, **config_changes) -> Path:
    """A checkpoint of `model_dir`'s architecture (with `config_changes`) with weights from `seed`."""
    config = AutoConfig.from_pretrained(model_dir)
    for key, value in config_changes.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out_dir)
    return out_dir


def edited(model_dir: Path, out_dir: Path, edit) -> Path:
    """A copy of the single-file checkpoint `model_dir` with `edit(tensors, names_in_byte_order)`
    applied to its {name: tensor}."""
    out_dir.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.name != "model.safetensors":
            (out_dir / path.name).write_bytes(path.read_bytes())
    file = model_dir / "model.safetensors"
    tensors = load_file(file)
    edit(tensors, [t.name for t in read_header(file)])
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    return out_dir


def served(model_dir: Path, device: str = "cpu") -> tuple[ModelRunner, WeightReceiver]:
    runner = ModelRunner(model_dir, device=device, num_kv_blocks=8, block_size=8)
    return runner, WeightReceiver(runner.model, HostWeights(runner.model), device)


def logits(runner: ModelRunner) -> torch.Tensor:
    """The prompt's last-token logits [1, vocab]: which weights serve, to the bit."""
    batch = ForwardBatch.build([PROMPT], [0], [[0, 1]], runner.block_size, runner.device)
    with torch.inference_mode():
        return runner.model(batch, runner.kv).cpu()


def weights_of(runner: ModelRunner) -> dict[str, torch.Tensor]:
    """A host copy of every parameter, packs included."""
    return {name: p.detach().cpu().clone() for name, p in runner.model.named_parameters()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8)) for n in a)
