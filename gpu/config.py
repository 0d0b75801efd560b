"""What our model code needs to know about a checkpoint, read from its config.json.

Hugging Face config files differ by architecture and by transformers version (v5 writes
`rope_parameters`, v4 `rope_theta` plus `rope_scaling`); this is the one place that reconciles
them, so the model code reads plain fields and an unsupported checkpoint fails here, by name.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    type: str = "default"
    factor: float = 1.0
    # llama3 only: the band of wavelengths between the two factors is interpolated smoothly.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeConfig
    qkv_bias: bool  # bias on q/k/v projections (Qwen2; Llama with attention_bias)
    o_bias: bool  # bias on the output projection (Llama with attention_bias only)
    mlp_bias: bool
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE (Qwen3)
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None
    sliding_window: int | None = None  # attention is full attention only up to this length
    torch_dtype: str | None = None  # the checkpoint's dtype, for information

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "ModelConfig":
        model_dir = Path(model_dir)
        config_path = model_dir / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"{model_dir} has no config.json; is it a Hugging Face model directory?")
        raw = json.loads(config_path.read_text())
        generation_path = model_dir / "generation_config.json"
        generation = json.loads(generation_path.read_text()) if generation_path.is_file() else {}
        return cls.from_dict(raw, generation)

    @classmethod
    def from_dict(cls, raw: dict, generation: dict | None = None) -> "ModelConfig":
        architectures = raw.get("architectures") or []
        architecture = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
        if architecture is None:
            raise ValueError(
                f"unsupported architectures {architectures}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {raw['hidden_act']!r}; only 'silu' is implemented")
        heads = raw["num_attention_heads"]
        attention_bias = bool(raw.get("attention_bias", False))
        is_qwen2 = architecture == "Qwen2ForCausalLM"
        return cls(
            architecture=architecture,
            hidden_size=raw["hidden_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            intermediate_size=raw["intermediate_size"],
            vocab_size=raw["vocab_size"],
            max_position_embeddings=raw["max_position_embeddings"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=_rope_config(raw),
            qkv_bias=is_qwen2 or attention_bias,  # Qwen2's q/k/v bias is fixed in its modeling code
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=architecture == "Qwen3ForCausalLM",
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            eos_token_ids=_eos_token_ids(raw, generation or {}),
            bos_token_id=raw.get("bos_token_id"),
            sliding_window=_sliding_window(raw),
            torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),
        )


def _rope_config(raw: dict) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    if rope_type == "default":
        return RopeConfig(theta)
    if rope_type == "linear":
        return RopeConfig(theta, "linear", float(params["factor"]))
    return RopeConfig(
        theta,
        "llama3",
        float(params["factor"]),
        float(params["low_freq_factor"]),
        float(params["high_freq_factor"]),
        int(params["original_max_position_embeddings"]),
    )


def _eos_token_ids(raw: dict, generation: dict) -> tuple[int, ...]:
    """Both files' ids: chat models often list the end-of-turn token in only one of them."""
    ids: list[int] = []
    for value in (raw.get("eos_token_id"), generation.get("eos_token_id")):
        for token in [value] if isinstance(value, int) else value or []:
            if token not in ids:
                ids.append(token)
    return tuple(ids)


def _sliding_window(raw: dict) -> int | None:
    # Qwen configs carry a window but switch it off with use_sliding_window; Mistral's is on when set.
    if raw.get("use_sliding_window") is False:
        return None
    return raw.get("sliding_window")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype a model computes in: `auto` is bf16 on CUDA and float32 on the CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]
