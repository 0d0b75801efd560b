"""The decoder-only transformer (Llama, Qwen2, Qwen3, Mistral) over a flattened ragged batch.

Module and parameter names mirror Hugging Face's (`model.layers.N.self_attn.q_proj.weight`...),
so checkpoints load by name with no mapping table. Attention itself is delegated to a backend,
which owns the paged-KV reads and writes.
"""

import torch
from torch import nn

from gpu.attention import AttentionBackend, TorchAttention
from gpu.batch import ForwardBatch
from gpu.config import ModelConfig
from gpu.kv_cache import KVCache
from gpu.layers import RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq

__all__ = ["CausalLM", "ModelConfig"]


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, q_size, kv_size = config.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, q_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, hidden, bias=config.o_bias)
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend, kv: KVCache
    ) -> torch.Tensor:
        # x: [T, hidden], cos/sin: [T, head_dim] -> [T, hidden]
        tokens = x.shape[0]
        q = self.q_proj(x).view(tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:  # Qwen3 normalizes each head before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = backend.attend(self.layer_index, q, k, v, kv)  # [T, heads, head_dim]
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=config.mlp_bias)
        self.up_proj = nn.Linear(hidden, inner, bias=config.mlp_bias)
        self.down_proj = nn.Linear(inner, hidden, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden]; SwiGLU
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend, kv: KVCache
    ) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden]; pre-norm residual blocks
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, backend, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """HF's `model.` prefix: embeddings, layers and the final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig, attention_backend: AttentionBackend | None = None) -> None:
        super().__init__()
        self.config = config
        self.attention_backend = attention_backend or TorchAttention(scale=config.head_dim**-0.5)
        self.model = DecoderStack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        # Made on the CPU even under a meta-device context, so a model built empty for loading
        # still has it; `.to(device)` moves it along with the weights.
        self.register_buffer("rope_inv_freq", rope_inv_freq(config.head_dim, config.rope), persistent=False)

    def tie_weights(self) -> None:
        """Shares the embedding matrix with the output head when the checkpoint ties them; call it
        again after replacing the embedding."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Runs the step's new tokens, writing their K/V, and returns float32 logits [S, vocab] of
        each sequence's last new token."""
        self.attention_backend.prepare(batch)
        x = self.model.embed_tokens(batch.input_ids)  # [T, hidden]
        cos, sin = rope_cos_sin(batch.positions, self.rope_inv_freq, x.dtype)  # [T, head_dim] each
        for layer in self.model.layers:
            x = layer(x, cos, sin, self.attention_backend, kv)
        last = self.model.norm(x[batch.last_token_index])  # [S, hidden]
        return self.lm_head(last).float()  # [S, vocab]
