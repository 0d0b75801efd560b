"""Reference attention in plain torch: one scaled_dot_product_attention call per sequence.

Slow for big batches, but it runs anywhere (CPU included) and is easy to check; the fast kernels
are tested against it.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpu.attention.base import AttentionBackend
from gpu.batch import ForwardBatch
from gpu.kv_cache import KVCache


@dataclass(frozen=True)
class _SequencePlan:
    start: int  # the sequence's first new token in the flat batch
    end: int
    context_len: int
    blocks: torch.Tensor  # [ceil(context_len / block_size)] int64 block ids
    mask: torch.Tensor | None  # [query_len, context_len] bool, True = may attend; None for one query


class TorchAttention(AttentionBackend):
    def __init__(self, scale: float) -> None:
        self.scale = scale
        self._plans: list[_SequencePlan] = []

    def prepare(self, batch: ForwardBatch) -> None:
        self._plans = []
        host = batch.host
        device = batch.kv_indices.device
        query_start, kv_indptr = host.query_start.tolist(), host.kv_indptr.tolist()
        indices = batch.kv_indices.long()
        for s, context_len in enumerate(host.context_lens.tolist()):
            start, end = query_start[s], query_start[s + 1]
            query_len = end - start
            mask = None
            if query_len > 1:
                # New token i sits at position context_len - query_len + i and sees keys up to it.
                first = context_len - query_len
                mask = torch.arange(context_len, device=device)[None, :] <= (
                    torch.arange(query_len, device=device)[:, None] + first
                )
            blocks = indices[kv_indptr[s] : kv_indptr[s + 1]]
            self._plans.append(_SequencePlan(start=start, end=end, context_len=context_len, blocks=blocks, mask=mask))

    def attend(self, layer: int, q: torch.Tensor, kv: KVCache, out: torch.Tensor | None = None) -> torch.Tensor:
        cache = kv.layers[layer]  # [num_blocks + 1, 2, block_size, kv_heads, head_dim]
        out = torch.empty_like(q) if out is None else out  # [T, heads, head_dim]
        for plan in self._plans:
            pages = cache[plan.blocks]  # [pages, 2, block_size, kv_heads, head_dim]
            keys = pages[:, 0].flatten(0, 1)[: plan.context_len]  # [context, kv_heads, head_dim]
            values = pages[:, 1].flatten(0, 1)[: plan.context_len]
            attended = F.scaled_dot_product_attention(
                q[plan.start : plan.end].transpose(0, 1),  # [heads, query, head_dim]
                keys.transpose(0, 1),  # [kv_heads, context, head_dim]
                values.transpose(0, 1),
                attn_mask=plan.mask,
                scale=self.scale,
                enable_gqa=True,  # query head h reads kv head h // (heads / kv_heads), as HF's repeat_kv
            )
            out[plan.start : plan.end] = attended.transpose(0, 1)
        return out
