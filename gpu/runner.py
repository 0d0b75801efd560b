"""The model, its KV pool and the sampler behind one `step` call: what the executor actor drives.

The runner knows nothing of requests or scheduling. Each step it is told, per sequence, which new
tokens to feed, where they go in the KV pool and how to sample; it returns the drawn tokens.
Block ids are owned by the scheduler; the runner only checks that they are in range.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from gpu.batch import ForwardBatch
from gpu.config import ModelConfig
from gpu.kv_cache import KVCache
from gpu.sampler import SamplingTensors, sample
from gpu.weights import load_model

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_KV_CACHE_BYTES = 256 << 20
CUDA_KV_CACHE_FRACTION = 0.85  # of the memory free once the weights are in; the rest is for activations


@dataclass(frozen=True)
class SequenceInput:
    token_ids: list[int]  # the new tokens to feed this step (a prompt chunk, or the one last sampled token)
    start_position: int  # how many tokens of this sequence are already in the KV cache
    block_table: list[int]  # KV block ids of this sequence, in order; must cover start_position + len(token_ids)
    sample: bool  # draw a token from the last position's logits (False for a non-final prompt chunk)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    output_index: int = 0  # the index of the output token being drawn (0 for the first), keys the randomness


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


class ModelRunner:
    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        dtype: str | torch.dtype = "auto",
        num_kv_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
        block_size: int = 16,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.config = ModelConfig.from_pretrained(model_dir)
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.block_size = block_size
        self.vocab_size = self.config.vocab_size
        self.eos_token_ids = list(self.config.eos_token_ids)
        # Past the sliding window our full attention would differ from the model's, so stop there.
        self.max_model_len = min(self.config.max_position_embeddings, self.config.sliding_window or 1 << 62)
        self.model = load_model(model_dir, self.config, self.device, self.dtype)
        self.num_kv_blocks = num_kv_blocks if num_kv_blocks is not None else self._blocks_that_fit(kv_cache_bytes)
        if self.num_kv_blocks < 1:
            raise ValueError("the KV cache has room for no block; give num_kv_blocks or more kv_cache_bytes")
        cfg = self.config
        self.kv = KVCache(
            cfg.num_hidden_layers, self.num_kv_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
            self.dtype, self.device,
        )

    def _blocks_that_fit(self, kv_cache_bytes: int | None) -> int:
        cfg = self.config
        per_block = KVCache.bytes_per_block(
            cfg.num_hidden_layers, self.block_size, cfg.num_key_value_heads, cfg.head_dim, self.dtype
        )
        if kv_cache_bytes is None:
            if self.device.type == "cuda":
                free_bytes, _total = torch.cuda.mem_get_info(self.device)
                kv_cache_bytes = int(free_bytes * CUDA_KV_CACHE_FRACTION)
            else:
                kv_cache_bytes = CPU_KV_CACHE_BYTES
        return kv_cache_bytes // per_block

    @torch.inference_mode()
    def step(self, seqs: list[SequenceInput]) -> list[int | None]:
        """Feeds every sequence's new tokens and returns one drawn token per sequence with
        `sample=True`, None for the others. Raises ValueError, before touching the KV cache, on
        input that would write outside a sequence's blocks or the pool."""
        if not seqs:
            return []
        for i, seq in enumerate(seqs):
            self._validate(i, seq)
        batch = ForwardBatch.build(
            [seq.token_ids for seq in seqs],
            [seq.start_position for seq in seqs],
            [seq.block_table for seq in seqs],
            self.block_size,
            self.device,
        )
        logits = self.model(batch, self.kv)  # [S, vocab] float32
        rows = [i for i, seq in enumerate(seqs) if seq.sample]
        if not rows:
            return [None] * len(seqs)
        chosen = [seqs[i] for i in rows]
        params = SamplingTensors.from_lists(
            [s.temperature for s in chosen], [s.top_p for s in chosen], [s.top_k for s in chosen],
            [s.seed for s in chosen], [s.output_index for s in chosen], self.device,
        )
        if len(rows) < len(seqs):
            logits = logits[torch.tensor(rows, device=self.device)]
        tokens = sample(logits, params).tolist()  # the step's one host sync
        out: list[int | None] = [None] * len(seqs)
        for row, token in zip(rows, tokens):
            out[row] = token
        return out

    def _validate(self, i: int, seq: SequenceInput) -> None:
        if not seq.token_ids:
            raise ValueError(f"sequence {i}: token_ids is empty; every sequence in a step feeds at least one token")
        if seq.start_position < 0:
            raise ValueError(f"sequence {i}: start_position {seq.start_position} is negative")
        end = seq.start_position + len(seq.token_ids)
        if end > self.max_model_len:
            raise ValueError(f"sequence {i}: {end} tokens exceed max_model_len {self.max_model_len}")
        if len(seq.block_table) * self.block_size < end:
            raise ValueError(
                f"sequence {i}: block table of {len(seq.block_table)} blocks holds "
                f"{len(seq.block_table) * self.block_size} tokens, but positions up to {end} are needed"
            )
        if min(seq.block_table) < 0 or max(seq.block_table) >= self.num_kv_blocks:
            raise ValueError(f"sequence {i}: block ids must be in [0, {self.num_kv_blocks})")
        if min(seq.token_ids) < 0 or max(seq.token_ids) >= self.vocab_size:
            raise ValueError(f"sequence {i}: token ids must be in [0, {self.vocab_size})")
