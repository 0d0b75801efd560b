"""A GGUF file of each architecture we serve converts (gpu/gguf_import.py) into a directory our model
code runs as transformers runs the model the file was made from.

The files are written from the tiny random models of gpu/model_builder.py the way llama.cpp's
converter writes them (tests/gguf_files.py), so the original weights, tokens and template are at
hand to compare the converted directory with.
"""

import json
from pathlib import Path
from typing import NamedTuple

import gguf
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from gpu.config import ModelConfig
from gpu.gguf_import import import_gguf
from gpu.runner import ModelRunner
from tests.gguf_files import write_gguf_from_hf
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, generate, random_prompt

# arch -> the class the converted config names. A Mistral file says "llama", and transformers
# reads it as Mistral only when general.name is exactly "mistral" (then fails: gguf-py has no
# such architecture), so llama.cpp's "Mistral" converts to Llama: the same network, since GGUF
# carries no sliding window.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "LlamaForCausalLM",
}
CONVERSATION = [
    {"role": "system", "content": "Answer in one line."},
    {"role": "user", "content": "Alice travelled to Brouth; it cost 42 coins!\n\nif (a != b) { return 7; }"},
]
Q8_0_BLOCK = 32


class Converted(NamedTuple):
    arch: str
    source: Path  # the model directory the GGUF file was written from
    model_dir: Path  # the directory import_gguf converted the file into


@pytest.fixture(scope="module", params=tuple(ARCHITECTURES))
def converted(request, build_tiny_model, tmp_path_factory) -> Converted:
    """Each architecture's model, written as an F32 GGUF file and imported."""
    arch = request.param
    work = tmp_path_factory.mktemp(f"gguf-{arch}")
    source = build_tiny_model(arch)  # head_dim 16, where transformers' reader alone would give Qwen3 128
    return Converted(arch, source, import_gguf(write_gguf_from_hf(source, work / f"{arch}.gguf"), work / "models"))


def test_f32_weights_survive_exactly(converted):
    _, source, model_dir = converted
    original = load_file(source / "model.safetensors")
    result = load_file(model_dir / "model.safetensors")
    assert result.keys() == original.keys()
    assert [name for name in original if not torch.equal(result[name], original[name])] == []


def test_greedy_tokens_match_transformers_on_the_original(converted, hf_greedy):
    _, source, model_dir = converted
    runner = ModelRunner(model_dir, device="cpu", num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    prompts = [random_prompt(n, seed=n) for n in (5, 13, 21)]
    outputs = generate(runner, prompts, 16)
    assert outputs == [hf_greedy(source, prompt, 16) for prompt in prompts]
    assert all(len(set(output)) > 4 for output in outputs)  # a looping model would match by chance


def test_tokenizer_and_chat_template_survive(converted, request):
    if converted.arch == "qwen3" and _transformers_before((5, 24)):
        # Seen on 5.17: its GGUF reader splits a qwen3 file's text as Qwen2 does whatever
        # tokenizer.ggml.pre says; real Qwen3 files say qwen2, but this test's tokenizer splits as GPT-2.
        request.applymarker(pytest.mark.xfail(reason="transformers < 5.24 ignores a qwen3 file's pre-tokenizer"))
    _, source, model_dir = converted
    template = json.loads((source / "tokenizer_config.json").read_text())["chat_template"]
    assert json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"] == template
    original, result = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(model_dir)
    prompt = original.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert result.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True) == prompt
    assert result(prompt)["input_ids"] == original(prompt)["input_ids"]


def _transformers_before(version: tuple[int, int]) -> bool:
    import transformers

    return tuple(int(part) for part in transformers.__version__.split(".")[:2]) < version


def test_config_names_the_architecture_and_every_end_token(converted):
    config = json.loads((converted.model_dir / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[converted.arch]]
    original, result = ModelConfig.from_pretrained(converted.source), ModelConfig.from_pretrained(converted.model_dir)
    assert sorted(result.eos_token_ids) == sorted(original.eos_token_ids)
    assert result.head_dim == original.head_dim


def q8_0_error_bound(weight: torch.Tensor) -> torch.Tensor:
    """The most Q8_0 can move each value of `weight` ([rows, cols]). Each run of 32 values in a row
    is stored as int8 multiples q of a scale d = max|x| / 127: rounding x / d errs by at most d / 2.
    The scale is kept in float16 (relative error at most 2^-11), which moves q * d, |q| <= 127, by
    at most 127 * d * 2^-11 more: |error| <= d * (1/2 + 127 / 2048) ~ 0.0044 * max|x|."""
    blocks = weight.reshape(weight.shape[0], -1, Q8_0_BLOCK)  # [rows, blocks, 32]
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 127
    bound = scale * (0.5 + 127 / 2048) * (1 + 1e-5)  # the slack: float32 arithmetic on either side
    return bound.expand_as(blocks).reshape(weight.shape)


def test_q8_0_file_converts_within_its_rounding_and_only_once(build_tiny_model, tmp_path):
    source = build_tiny_model("llama")
    gguf_file = write_gguf_from_hf(source, tmp_path / "llama-q8_0.gguf", gguf.GGMLQuantizationType.Q8_0)
    model_dir = import_gguf(gguf_file, tmp_path / "models")
    original = load_file(source / "model.safetensors")
    result = load_file(model_dir / "model.safetensors")
    matrices = [name for name, weight in original.items() if weight.ndim == 2]
    assert len(matrices) == 2 + 7 * 2  # embeddings, lm_head, and seven per layer: all quantized
    for name in matrices:
        assert not torch.equal(result[name], original[name]), name
        assert ((result[name] - original[name]).abs() <= q8_0_error_bound(original[name])).all(), name
    vectors = [name for name in original if name not in matrices]
    assert [name for name in vectors if not torch.equal(result[name], original[name])] == []  # norms stay F32

    converted_at = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert import_gguf(gguf_file, tmp_path / "models") == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == converted_at
