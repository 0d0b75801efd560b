"""Reference attention in plain torch, one query token at a time.

Slow for long prompts, but it runs anywhere (CPU included) and is easy to check; the fast kernels
are tested against it. Each query is computed alone over exactly the keys it sees: products and
attention kernels block their rows by the call's shape, so a token attended beside others (a
prompt) would differ in the last bits from the same token attended alone (a decode). Alone, a
token's output does not depend on how the steps were cut, which is what lets the CPU return exactly
the same logprob for a sampled token and for that token fed back in a prompt.
"""

from dataclasses import dataclass

import torch

from gpu.attention.base import AttentionBackend
from gpu.forward_batch import ForwardBatch
from gpu.kv_cache import KVCache


@dataclass(frozen=True)
class _SequencePlan:
    start: int  # the sequence's first new token in the flat batch
    end: int
    context_len: int
    blocks: torch.Tensor  # [ceil(context_len / block_size)] int64 block ids


class TorchAttention(AttentionBackend):
    def __init__(self, scale: float) -> None:
        self.scale = scale
        self._plans: list[_SequencePlan] = []

    def prepare(self, batch: ForwardBatch) -> None:
        host = batch.host
        query_start, kv_indptr = host.query_start.tolist(), host.kv_indptr.tolist()
        indices = batch.kv_indices.long()
        self._plans = [
            _SequencePlan(
                start=query_start[s],
                end=query_start[s + 1],
                context_len=context_len,
                blocks=indices[kv_indptr[s] : kv_indptr[s + 1]],
            )
            for s, context_len in enumerate(host.context_lens.tolist())
        ]

    def attend(self, layer: int, q: torch.Tensor, kv: KVCache, out: torch.Tensor | None = None) -> torch.Tensor:
        cache = kv.layers[layer]  # [num_blocks + 1, 2, block_size, kv_heads, head_dim]
        out = torch.empty_like(q) if out is None else out  # [T, heads, head_dim]
        tokens, heads, head_dim = q.shape
        kv_heads = cache.shape[3]
        for plan in self._plans:
            pages = cache[plan.blocks]  # [pages, 2, block_size, kv_heads, head_dim]
            keys, values = (pages[:, i].flatten(0, 1)[: plan.context_len].transpose(0, 1) for i in (0, 1))
            for token in range(plan.start, plan.end):
                # The new token sits at position context_len - (end - token) and sees the keys up to it.
                seen = plan.context_len - (plan.end - 1 - token)
                # Query head h reads kv head h // (heads / kv_heads), as HF's repeat_kv.
                # In float32, as an attention kernel accumulates: a bf16 product would round each score.
                query = q[token].view(kv_heads, heads // kv_heads, head_dim).float()  # [kv_heads, group, head_dim]
                scores = query @ keys[:, :seen].float().transpose(1, 2) * self.scale  # [kv_heads, group, seen]
                attended = scores.softmax(dim=-1) @ values[:, :seen].float()  # [kv_heads, group, head_dim]
                out[token] = attended.view(heads, head_dim).to(out.dtype)
        return out
