"""Built model directories are complete, loadable checkpoints with a working tokenizer."""

import json
import time
import unicodedata

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from gpu.model_builder import build_model_dir
from gpu.model_dir import is_complete
from gpu.runner import ModelRunner
from gpu.step_io import SequenceInput
from gpu.tokenizer_builder import train_tokenizer

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_directory_is_complete_and_consistent(tiny_model_dir, tokenizer):
    assert all((tiny_model_dir / name).is_file() for name in FILES)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    generation = json.loads((tiny_model_dir / "generation_config.json").read_text())
    eot, end = tokenizer.convert_tokens_to_ids(["<|eot_id|>", "<|end_of_text|>"])
    assert config["eos_token_id"] == generation["eos_token_id"] == [eot, end]
    assert config["bos_token_id"] == tokenizer.bos_token_id == tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    assert config["vocab_size"] == len(tokenizer) == 1024
    assert config["tie_word_embeddings"] is False
    assert "chat_template" in json.loads((tiny_model_dir / "tokenizer_config.json").read_text())


def test_building_again_returns_the_existing_model(build_tiny_model):
    model_dir = build_tiny_model("llama")
    weights = model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    started = time.monotonic()
    assert build_model_dir(model_dir, arch="llama", size="tiny", seed=3) == model_dir
    assert time.monotonic() - started < 0.5
    assert weights.stat().st_mtime_ns == before


def test_refuses_a_directory_that_is_not_a_built_model(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="complete built model"):
        build_model_dir(tmp_path, size="tiny")
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("arch, size", [("gpt2", "tiny"), ("llama", "huge")])
def test_rejects_unknown_arch_or_size(tmp_path, arch, size):
    with pytest.raises(ValueError, match="choose from"):
        build_model_dir(tmp_path / "m", arch=arch, size=size)


def test_demo_model_builds_fast_and_generates_varied_text(tmp_path):
    started = time.monotonic()
    model_dir = build_model_dir(tmp_path / "demo", arch="llama", size="demo")
    assert time.monotonic() - started < 10  # imports are already warm; the build itself is ~1 s
    assert is_complete(model_dir)
    assert not [p for p in tmp_path.iterdir() if p.name != "demo"]  # no staging directory left behind
    runner = ModelRunner(model_dir, num_kv_blocks=8, block_size=16)
    assert (runner.config.hidden_size, runner.config.num_hidden_layers, runner.vocab_size) == (256, 4, 2048)
    prompt = AutoTokenizer.from_pretrained(model_dir).encode("Once upon a time, there was a tiny model")
    token = runner.step([SequenceInput(prompt, 0, list(range(8)), sample=True)])[0]
    output = [token]
    for position in range(len(prompt), len(prompt) + 29):
        output.append(runner.step([SequenceInput([output[-1]], position, list(range(8)), sample=True)])[0])
    assert len(set(output)) >= 15
    with torch.inference_mode():
        weights_max = max(p.abs().max().item() for p in runner.model.parameters())
    assert weights_max < 2  # tame: bf16 and fp16 hold these weights and their products comfortably


def test_tokenizer_training_is_deterministic():
    assert train_tokenizer(1024).backend_tokenizer.to_str() == train_tokenizer(1024).backend_tokenizer.to_str()


@settings(max_examples=150, deadline=None)
@given(text=st.text())
def test_any_text_round_trips(tiny_model_dir, tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    # Qwen2's tokenizer normalizes to NFC, as the real one does; the others keep text byte for byte.
    expected = unicodedata.normalize("NFC", text) if tiny_model_dir.name == "qwen2" else text
    assert tokenizer.decode(ids) == expected


def test_transformers_tokenizer_agrees_with_the_file(tiny_model_dir, tokenizer):
    """transformers may pick an architecture's own tokenizer class; it must still tokenize as trained."""
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    text = "Hello  wörld's\n\n\tcafé 12345 ✓ 日本語 🙂 x = f(y) <|eot_id|>"
    assert tokenizer.encode(text) == raw.encode(text).ids


def test_plain_encoding_starts_with_bos(tokenizer):
    ids = tokenizer.encode("Hello there")
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Hello there"


def test_chat_template_renders_llama3_turns(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi! "}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    without_prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert without_prompt.endswith("Hi!<|eot_id|>")
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.convert_tokens_to_ids("<|eot_id|>")) == 2
