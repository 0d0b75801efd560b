"""Checkpoint variants load and match transformers; checkpoints we cannot run fail by name."""

import json
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from gpu.config import ModelConfig, RopeConfig
from gpu.forward_batch import ForwardBatch
from gpu.runner import ModelRunner

LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=10000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
)


def variant(base_dir, out_dir, **changes):
    """A freshly initialised HF model like `base_dir`'s, with config changes, saved to `out_dir`."""
    config = AutoConfig.from_pretrained(base_dir)
    for key, value in changes.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out_dir)
    return out_dir


def assert_logits_match(model_dir, prompt_len=40):
    """Prefill then one decode, at positions past 16 so RoPE scaling matters; compared with HF."""
    rng = random.Random(prompt_len)
    prompt = [rng.randrange(5, 1000) for _ in range(prompt_len + 1)]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0, [-2, -1]]
    runner = ModelRunner(model_dir, num_kv_blocks=8, block_size=8)
    table = [6, 1, 4, 0, 3, 7]
    with torch.inference_mode():
        prefill = runner.model(ForwardBatch.build([prompt[:-1]], [0], [table], 8, "cpu"), runner.kv)
        decode = runner.model(ForwardBatch.build([prompt[-1:]], [prompt_len], [table], 8, "cpu"), runner.kv)
    assert (torch.cat([prefill, decode]) - expected).abs().max().item() < 1e-4


def test_tied_embeddings(build_tiny_model, tmp_path):
    model_dir = variant(build_tiny_model("qwen3"), tmp_path / "tied", tie_word_embeddings=True)
    runner = ModelRunner(model_dir, num_kv_blocks=8, block_size=8)
    assert runner.model.lm_head.weight is runner.model.model.embed_tokens.weight
    assert_logits_match(model_dir)


@pytest.mark.parametrize(
    "rope", [LLAMA3_ROPE, dict(rope_type="linear", rope_theta=500.0, factor=4.0)], ids=["llama3", "linear"]
)
def test_scaled_rope(build_tiny_model, tmp_path, rope):
    model_dir = variant(build_tiny_model("llama"), tmp_path / "rope", rope_parameters=rope)
    assert ModelConfig.from_pretrained(model_dir).rope.type == rope["rope_type"]
    assert_logits_match(model_dir)


def test_transformers_v4_config_layout():
    raw = dict(
        architectures=["LlamaForCausalLM"],
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=100,
        max_position_embeddings=128,
        rope_theta=5e5,
        rope_scaling={
            "type": "llama3",
            **{k: v for k, v in LLAMA3_ROPE.items() if k not in ("rope_type", "rope_theta")},
        },
        eos_token_id=7,
        torch_dtype="bfloat16",
    )
    config = ModelConfig.from_dict(raw, {"eos_token_id": [9, 7]})
    assert config.rope == RopeConfig(5e5, "llama3", 8.0, 1.0, 4.0, 16)
    assert (config.head_dim, config.num_key_value_heads, config.eos_token_ids) == (16, 4, (7, 9))
    assert config.torch_dtype == "bfloat16"


def test_mistral_sliding_window_caps_the_length(build_tiny_model, tmp_path):
    model_dir = tmp_path / "windowed"
    shutil.copytree(build_tiny_model("mistral"), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"sliding_window": 100}))
    assert ModelRunner(model_dir, num_kv_blocks=4).max_model_len == 100


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "LlamaForCausalLM, Qwen2ForCausalLM"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "unsupported rope type 'yarn'"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unsupported_configs_fail_by_name(build_tiny_model, changes, message):
    raw = json.loads((build_tiny_model("llama") / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(raw | changes)


def damaged_copy(source, target, edit):
    shutil.copytree(source, target)
    tensors = load_file(target / "model.safetensors")
    edit(tensors)
    save_file(tensors, target / "model.safetensors")
    return target


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "missing model.layers.1.mlp.up_proj.weight"),
        (lambda t: t.update({"model.layers.9.extra": torch.zeros(2)}), "unexpected model.layers.9.extra"),
        (lambda t: t.update({"model.norm.weight": torch.ones(3)}), "model.norm.weight .* has shape"),
    ],
    ids=["missing", "unexpected", "wrong-shape"],
)
def test_mismatched_checkpoint_fails_by_name(build_tiny_model, tmp_path, edit, message):
    model_dir = damaged_copy(build_tiny_model("llama"), tmp_path / "damaged", edit)
    with pytest.raises(ValueError, match=message):
        ModelRunner(model_dir, num_kv_blocks=4)


def test_a_tensor_stored_twice_fails_by_name(build_tiny_model, tmp_path):
    model_dir = shutil.copytree(build_tiny_model("llama"), tmp_path / "twice")
    tensors = load_file(model_dir / "model.safetensors")
    (model_dir / "model.safetensors").rename(model_dir / "model-1.safetensors")
    save_file({"model.norm.weight": tensors["model.norm.weight"]}, model_dir / "model-2.safetensors")
    weight_map = dict.fromkeys(tensors, "model-1.safetensors") | {"model.norm.weight": "model-2.safetensors"}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="model.norm.weight is stored twice"):
        ModelRunner(model_dir, num_kv_blocks=4)
