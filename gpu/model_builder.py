"""Builds Hugging Face model directories with seeded random weights and a locally trained tokenizer.

The random `demo` model (`--model demo`) and the small models the tests use come from here, so
nothing is ever downloaded. Weights come from transformers' own classes, so the directories are real
checkpoints that `AutoModelForCausalLM` loads: the reference our own model code is tested against.

    python -m gpu.model_builder --out DIR [--arch llama] [--size demo] [--seed 0]
"""

import argparse
import json
from pathlib import Path

import torch
import transformers

from gpu.model_dir import write_once
from gpu.tokenizer_builder import BOS, END_OF_TEXT, EOT, train_tokenizer

# arch -> (transformers config class, model class, what sets the architecture apart)
_ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=False)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=False)),  # q/k/v bias is built in
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(attention_bias=False, use_sliding_window=False)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
}
ARCHS = tuple(_ARCHS)

# initializer_range: with the usual 0.02 these small random models repeat one token forever; the
# values below keep greedy output varied, with logits of std ~1.6 and clear top-1 margins (so float
# rounding rarely flips an argmax), while weights stay small (tests/gpu/test_model_builder.py).
_SIZES = {
    "demo": dict(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=4096,
        initializer_range=0.1,
        vocab=2048,
    ),
    # FlashInfer's prebuilt kernels are for head_dim 128: the smallest model its path can be tested on.
    # Four query heads to a KV head, as in llama-3.1-8b: FlashInfer decodes it on tensor cores.
    "hd128": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=4096,
        initializer_range=0.1,
        vocab=1024,
    ),
    # The default model's attention (SmolLM2-135M-Instruct: head_dim 64, three query heads to a KV
    # head, tied embeddings) in four layers: its stand-in where its real weights are not at hand.
    "smollm2": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=4096,
        initializer_range=0.1,
        tie_word_embeddings=True,
        vocab=2048,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        initializer_range=0.2,
        vocab=1024,
    ),
}


def _hf_model(arch: str, size: str, vocab_size: int, bos_id: int, eos_ids: list[int]) -> transformers.PreTrainedModel:
    config_class, model_class, specific = _ARCHS[arch]
    shape = {k: v for k, v in _SIZES[size].items() if k != "vocab"}
    config = getattr(transformers, config_class)(
        vocab_size=vocab_size,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        bos_token_id=bos_id,
        eos_token_id=eos_ids,
        **({"tie_word_embeddings": False} | shape),
        **specific,
    )
    return getattr(transformers, model_class)(config)


def _write_model(out: Path, arch: str, size: str, seed: int) -> None:
    tokenizer = train_tokenizer(_SIZES[size]["vocab"], qwen2_style=arch == "qwen2")
    bos_id = tokenizer.convert_tokens_to_ids(BOS)
    eos_ids = [tokenizer.convert_tokens_to_ids(EOT), tokenizer.convert_tokens_to_ids(END_OF_TEXT)]

    torch.manual_seed(seed)
    model = _hf_model(arch, size, len(tokenizer), bos_id, eos_ids).to(torch.float32).eval()
    model.generation_config = transformers.GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_ids)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)


def save_tokenizer(tokenizer: transformers.PreTrainedTokenizerFast, out: Path) -> None:
    """Written as one config file with the template inside, the layout older transformers read too."""
    tokenizer.save_pretrained(out, save_jinja_files=False)
    tokenizer_config_path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config["unk_token"] = None  # else Qwen2Tokenizer adds an <|endoftext|> past the vocabulary
    tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
    special = {"bos_token": BOS, "eos_token": EOT, "pad_token": END_OF_TEXT}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def build_model_dir(path: str | Path, arch: str = "llama", size: str = "demo", seed: int = 0) -> Path:
    """Writes a complete model directory at `path` and returns it; returns at once if one is there."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHS)}")
    if size not in _SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(_SIZES)}")
    description = {"arch": arch, "size": size, "seed": seed}
    return write_once(path, lambda staging: _write_model(staging, arch, size, seed), description)


def main() -> None:
    parser = argparse.ArgumentParser(description="Build a random-weight Hugging Face model directory.")
    parser.add_argument("--out", required=True, help="directory to write (left alone if already complete)")
    parser.add_argument("--arch", default="llama", choices=ARCHS)
    parser.add_argument("--size", default="demo", choices=tuple(_SIZES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_model_dir(args.out, args.arch, args.size, args.seed))


if __name__ == "__main__":
    main()
