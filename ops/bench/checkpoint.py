"""Writes the in-process benchmark's random-weight model as a Hugging Face model directory, so the
whole system can serve the very weights the in-process figures came from: safetensors shards with
their index, config.json, and a tokenizer with one entry per token id of the model.
"""

import itertools
import json
import string
import time
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer

from gpu.config import ModelConfig
from gpu.model import CausalLM
from gpu.model_builder import save_tokenizer
from gpu.tokenizer_builder import train_tokenizer
from gpu.weights import random_model
from ops.bench.shapes import SHAPES

SHARD_BYTES = 4 << 30
TRAINED_VOCAB = 1024  # what the tokenizer corpus yields comfortably; the rest of the ids are filler
MARKER = ".bench-checkpoint.json"


def random_checkpoint(out: Path, model: str, device: torch.device, dtype: torch.dtype) -> Path:
    """A checkpoint of `model`'s shape (ops/bench/shapes.py) with random weights (seed 0) in `out`,
    written unless it is there already."""
    identity = {"model": model, "seed": 0, "dtype": str(dtype).removeprefix("torch.")}
    marker = out / MARKER
    if not (marker.is_file() and json.loads(marker.read_text()) == identity):
        raw = SHAPES[model]
        weights = random_model(ModelConfig.from_dict(raw), device, dtype, seed=0)
        write_checkpoint(weights, raw, out, identity)
        del weights
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def write_checkpoint(model: CausalLM, raw_config: dict, out: Path, identity: dict) -> float:
    """Writes `model` (and its config, and a tokenizer) into `out`; returns the seconds it took, 0
    when `out` already holds the checkpoint of `identity` (the shape's name and the weights' seed)."""
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == identity:
        return 0.0
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    config = ModelConfig.from_dict(raw_config)
    _write_weights(model, config, out)
    architecture = raw_config["architectures"][0]
    model_type = getattr(transformers, architecture.replace("ForCausalLM", "Config")).model_type
    (out / "config.json").write_text(json.dumps({**raw_config, "model_type": model_type}, indent=2) + "\n")
    served = ModelConfig.from_pretrained(out)
    if served != config:
        raise RuntimeError(f"the written config.json reads back as {served}, not {config}")
    write_tokenizer(out, config.vocab_size)
    marker.write_text(json.dumps(identity) + "\n")
    return time.perf_counter() - started


def _write_weights(model: CausalLM, config: ModelConfig, out: Path) -> None:
    """The tensors the loader expects, in shards of about SHARD_BYTES; the packed q/k/v and gate/up
    copies the model made for itself are left out (the loader packs them again)."""
    with torch.device("meta"):
        expected = [name for name, _ in CausalLM(config).named_parameters()]
    present = dict(model.named_parameters())
    shards: list[list[str]] = [[]]
    size = 0
    for name in expected:
        nbytes = present[name].numel() * present[name].element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    weight_map, total = {}, 0
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        # A copy of each tensor in host memory with storage of its own (q/k/v are views of one packed tensor).
        tensors = {name: torch.empty_like(present[name], device="cpu").copy_(present[name]) for name in names}
        save_file(tensors, out / file, metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_tokenizer(out: Path, vocab_size: int) -> None:
    """gpu.tokenizer_builder's byte-level BPE, saved as gpu.model_builder saves it, then padded to
    `vocab_size` with word-like tokens no merge produces: random weights draw any id, and each must
    decode to text, as with a real tokenizer of the model's vocabulary, or the detokenizer would skip it."""
    save_tokenizer(train_tokenizer(min(vocab_size, TRAINED_VOCAB)), out)

    path = out / "tokenizer.json"
    state = json.loads(path.read_text())
    vocab: dict[str, int] = state["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    for letters in itertools.chain.from_iterable(
        itertools.product(string.ascii_lowercase, repeat=n) for n in itertools.count(2)
    ):
        if next_id >= vocab_size:
            break
        token = "Ġ" + "".join(letters)  # byte-level BPE's spelling of " " + letters
        if token not in vocab:
            vocab[token] = next_id
            next_id += 1
    path.write_text(json.dumps(state, ensure_ascii=False))
    written = Tokenizer.from_file(str(path)).get_vocab_size()
    if written != vocab_size:
        raise RuntimeError(f"the tokenizer has {written} tokens, the model {vocab_size}")
