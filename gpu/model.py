"""The decoder-only transformer (Llama, Qwen2, Qwen3, Mistral) over a flattened ragged batch.

Module and parameter names mirror Hugging Face's (`model.layers.N.self_attn.q_proj.weight`...),
so checkpoints load by name with no mapping table. After loading, `fuse_projections` packs q/k/v and
gate/up into one matrix each, the per-module parameters becoming views of it: one product instead of
three, and a weight update written in place (`param.copy_`) reaches the packed matrix. Attention is
delegated to a backend, which reads the paged KV cache; on the GPU in bf16/fp16 the norms, rotary
embedding, KV write and activation run as fused Triton kernels (gpu/kernels.py), and a single
token's products as our matrix-vector kernel (gpu/gemv.py). The products and the residual norm are
`Operators` the layers hold: `--deterministic` swaps in gpu/invariant's (`use_operators`).
"""

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from gpu.attention import AttentionBackend, TorchAttention
from gpu.config import ModelConfig
from gpu.forward_batch import ForwardBatch
from gpu.gemv import linear, silu_mul_linear
from gpu.kv_cache import KVCache
from gpu.layers import RMSNorm, apply_rope, rms_norm, rope_cos_sin, rope_inv_freq

__all__ = ["CausalLM", "LastLayer", "ModelConfig", "Operators", "DEFAULT_OPERATORS"]

_FUSED_DTYPES = (torch.bfloat16, torch.float16)


def _uses_kernels(x: torch.Tensor) -> bool:
    # float32 keeps the torch path: it is the one checked token for token against transformers.
    return x.is_cuda and x.dtype in _FUSED_DTYPES


def _pack(module: nn.Module, parts: list[nn.Linear], name: str) -> None:
    """Registers `name`_weight (and _bias) as the concatenation of `parts`, which become views of it."""
    weight = torch.cat([p.weight.detach() for p in parts])
    module.register_parameter(f"{name}_weight", nn.Parameter(weight, requires_grad=False))
    has_bias = parts[0].bias is not None
    bias = torch.cat([p.bias.detach() for p in parts]) if has_bias else None
    module.register_parameter(f"{name}_bias", nn.Parameter(bias, requires_grad=False) if has_bias else None)
    row = 0
    for p in parts:
        rows = p.weight.shape[0]
        p.weight = nn.Parameter(weight[row : row + rows], requires_grad=False)
        if has_bias:
            p.bias = nn.Parameter(bias[row : row + rows], requires_grad=False)
        row += rows


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + x), residual + x); with no residual yet, (norm(x), x). x: [T, hidden]"""
    if _uses_kernels(x):
        from gpu.kernels import add_rms_norm as fused

        return fused(x, residual, norm.weight, norm.eps)
    residual = x if residual is None else residual + x
    return rms_norm(residual, norm.weight, norm.eps), residual


def silu_mul_down(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """linear(silu(gate) * up, weight, bias): SwiGLU's down projection, the activation fused on the
    GPU path. gate_up: [T, 2 * inner], weight: [hidden, inner] -> [T, hidden]"""
    if _uses_kernels(gate_up):
        return silu_mul_linear(gate_up, weight, bias)
    gate, up = gate_up.chunk(2, dim=-1)
    return linear(F.silu(gate) * up, weight, bias)


class Operators(NamedTuple):
    """The operators a model computes its rows with. By default each is the quickest for its shape
    (our GEMV for one row on the GPU, cuBLAS beyond), so a token's numbers depend in their last bits
    on how many rows share its call; gpu/invariant's make every row the same bits in any batch."""

    linear: Callable[..., torch.Tensor]  # (x [T, K], weight [N, K], bias [N] | None) -> [T, N]
    silu_mul_down: Callable[..., torch.Tensor]  # (gate_up [T, 2I], weight [H, I], bias) -> [T, H]: SwiGLU, then down
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (x, residual, RMSNorm), as add_rms_norm


DEFAULT_OPERATORS = Operators(linear=linear, silu_mul_down=silu_mul_down, add_rms_norm=add_rms_norm)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.eps = config.rms_norm_eps
        hidden, q_size, kv_size = config.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, q_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, hidden, bias=config.o_bias)
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.register_parameter("qkv_weight", None)  # packed by fuse(), after loading
        self.register_parameter("qkv_bias", None)
        self.operators = DEFAULT_OPERATORS

    def fuse(self) -> None:
        _pack(self, [self.q_proj, self.k_proj, self.v_proj], "qkv")

    def query(self, x: torch.Tensor, rope: "RopeInputs", kv: KVCache) -> torch.Tensor:
        """Projects x to q/k/v, rotates q and k, and writes the new K/V into the cache; returns the
        rotated queries. x: [T, hidden] -> [T, heads, head_dim]"""
        tokens = x.shape[0]
        if self.qkv_weight is None:
            raise RuntimeError("call CausalLM.fuse_projections() after loading the weights")
        qkv = self.operators.linear(x, self.qkv_weight, self.qkv_bias)  # [T, (heads + 2 kv_heads) * head_dim]
        if _uses_kernels(x):
            from gpu.kernels import rope_store_kv

            return rope_store_kv(
                qkv,
                rope.positions,
                rope.inv_freq,
                kv.layers[self.layer_index],
                rope.slot_mapping,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.q_norm.weight if self.qk_norm else None,
                self.k_norm.weight if self.qk_norm else None,
                self.eps,
            )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:  # Qwen3 normalizes each head before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, rope.cos, rope.sin), apply_rope(k, rope.cos, rope.sin)
        kv.write(self.layer_index, k, v, rope.slot_mapping)
        return q

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        # attended: [T, heads, head_dim] -> [T, hidden]
        tokens = attended.shape[0]
        flat = attended.reshape(tokens, self.num_heads * self.head_dim)
        return self.operators.linear(flat, self.o_proj.weight, self.o_proj.bias)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=config.mlp_bias)
        self.up_proj = nn.Linear(hidden, inner, bias=config.mlp_bias)
        self.down_proj = nn.Linear(inner, hidden, bias=config.mlp_bias)
        self.register_parameter("gate_up_weight", None)  # packed by fuse(), after loading
        self.register_parameter("gate_up_bias", None)
        self.operators = DEFAULT_OPERATORS

    def fuse(self) -> None:
        _pack(self, [self.gate_proj, self.up_proj], "gate_up")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden]; SwiGLU
        gate_up = self.operators.linear(x, self.gate_up_weight, self.gate_up_bias)  # [T, 2 * inner]
        return self.operators.silu_mul_down(gate_up, self.down_proj.weight, self.down_proj.bias)


class RopeInputs:
    """What the layers need for the rotary embedding: positions for the fused kernel, cos/sin for
    the torch path, and the KV slots the new tokens write."""

    def __init__(
        self,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        inv_freq: torch.Tensor,
        dtype: torch.dtype,
        fused: bool,
    ) -> None:
        self.positions = positions  # [T]
        self.slot_mapping = slot_mapping  # [T]
        self.inv_freq = inv_freq  # [head_dim / 2] float32
        self.cos = self.sin = None
        if not fused:
            self.cos, self.sin = rope_cos_sin(positions, inv_freq, dtype)  # [T, head_dim] each


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)
        self.operators = DEFAULT_OPERATORS

    # A layer runs as query -> attention -> finish; CUDA graphs capture the two halves and leave the
    # attention, whose kernels depend on how the step's tokens split into sequences, outside.
    def query(
        self, x: torch.Tensor, residual: torch.Tensor | None, rope: RopeInputs, kv: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the last sublayer's output [T, hidden] (the embeddings for layer 0, with no residual
        yet) -> (queries [T, heads, head_dim], residual [T, hidden]); writes the layer's new K/V."""
        h, residual = self.operators.add_rms_norm(x, residual, self.input_layernorm)
        return self.self_attn.query(h, rope, kv), residual

    def finish(self, attended: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """attended: the attention's output [T, heads, head_dim] -> (the MLP's output, residual)"""
        h, residual = self.operators.add_rms_norm(
            self.self_attn.output(attended), residual, self.post_attention_layernorm
        )
        return self.mlp(h), residual


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
        self.operators = DEFAULT_OPERATORS

    def tie_weights(self) -> None:
        """Shares the embedding matrix with the output head when the checkpoint ties them; call it
        again after replacing the embedding."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def use_operators(self, operators: Operators) -> None:
        """Computes every layer's products and norms, and the output head's, with `operators`."""
        self.operators = operators
        for layer in self.model.layers:
            layer.operators = layer.self_attn.operators = layer.mlp.operators = operators

    def fuse_projections(self) -> None:
        """Packs q/k/v and gate/up; call once the weights are in place on their device."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Runs the step's new tokens, writing their K/V, and returns float32 logits [R, vocab] of
        the tokens in `batch.logits_index`."""
        self.attention_backend.prepare(batch)
        return self.compute_logits(batch, kv)

    def compute_logits(self, batch: ForwardBatch, kv: KVCache, out: torch.Tensor | None = None) -> torch.Tensor:
        """The forward pass once the backend is planned; what a CUDA graph captures. `out`: where
        to write the logits (a graph's static output) instead of a new tensor."""
        return self.logits(self.run_layers(batch, kv), batch.logits_index, out)

    def run_layers(self, batch: ForwardBatch, kv: KVCache) -> "LastLayer":
        """Every layer over the step's tokens, once the backend is planned: what logits are taken from."""
        x = self.model.embed_tokens(batch.input_ids)  # [T, hidden]
        rope = self.rope_inputs(batch.positions, batch.slot_mapping, x)
        residual = None
        for i, layer in enumerate(self.model.layers):
            kv.arrivals.wait_for(i)  # layer i of the loads from the host tier has landed: read, or written over
            q, residual = layer.query(x, residual, rope, kv)  # writes the new tokens' KV of layer i
            x, residual = layer.finish(self.attention_backend.attend(i, q, kv), residual)
        return LastLayer(output=x, residual=residual)

    def rope_inputs(self, positions: torch.Tensor, slot_mapping: torch.Tensor, x: torch.Tensor) -> RopeInputs:
        """The rotary inputs of tokens at `positions` [T] writing KV `slot_mapping` [T], for hidden
        states like x [T, hidden]."""
        return RopeInputs(positions, slot_mapping, self.rope_inv_freq, x.dtype, fused=_uses_kernels(x))

    def logits(
        self, last: "LastLayer", logits_index: torch.Tensor | None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """float32 logits [R, vocab] of the tokens in `logits_index` [R] (all when None), from the
        last layer; written to `out` when given. A token's logits are the same numbers whichever
        other tokens share the call on the CPU (gpu/gemv.py:linear), and everywhere with the
        deterministic operators."""
        final = self.final_hidden(last, logits_index)  # [R, hidden]
        logits = self.operators.linear(
            final, self.lm_head.weight
        )  # [R, vocab] in the model dtype, as transformers computes them
        if out is None:
            return logits.float()
        return out.copy_(logits)

    def final_hidden(self, last: "LastLayer", index: torch.Tensor | None) -> torch.Tensor:
        """The hidden states [n, hidden] of the tokens at `index` [n] (all when None) after the final
        norm, in the model dtype: what the LM head reads, and what an embedding pools. With `index`
        given, `last` is left as it was."""
        x, residual = last
        if index is not None:
            x, residual = x[index], residual[index]  # copies: the fused norm adds into the residual
        final, _ = self.operators.add_rms_norm(x, residual, self.model.norm)
        return final


class LastLayer(NamedTuple):
    """The last layer's output and residual stream of a step's tokens, before the final norm."""

    output: torch.Tensor  # [T, hidden]
    residual: torch.Tensor  # [T, hidden]
