"""One model step's input laid out on the host: the new tokens of every sequence, flattened, plus the
paged-KV metadata; and its growth onto the scratch block to the shape a CUDA graph or bucket runs at.

Prefill, a prompt chunk on top of cached KV and decode are one case: sequence s feeds `query_len`
new tokens at positions `context_len - query_len ..< context_len`. The metadata is built with numpy
(no per-token Python); the KV pages of each sequence are kept ragged (indptr + indices), the form
FlashInfer plans from. gpu/forward_batch.py copies it to the device.
"""

from dataclasses import dataclass, replace
from itertools import chain
from typing import Generic, NamedTuple

import numpy as np

from gpu.batch_limits import BatchLimits, check_ids, check_shapes, first_true
from gpu.staging import Array

# The input token of a decode whose token the previous step drew on the device and the host has
# not seen yet; `HostBatch.build` leaves a placeholder there for the device to fill in.
FROM_PREVIOUS_STEP = -1


class TokenColumns(NamedTuple, Generic[Array]):
    """The three thirds of a step's token data, each [T] int32, in this order: what one token needs,
    stored as one array so a CUDA graph's inputs take a single copy."""

    input_ids: Array
    positions: Array
    slot_mapping: Array  # flat KV slot: block id * block_size + offset in the block


@dataclass(frozen=True)
class HostBatch:
    token_data: np.ndarray  # [3T] int32: input ids | positions | flat KV slots (`token_thirds` names them)
    query_start: np.ndarray  # [S+1] int32, sequence s owns tokens query_start[s] ..< query_start[s+1]
    kv_indptr: np.ndarray  # [S+1] int32, sequence s reads KV pages kv_indices[kv_indptr[s] ..< kv_indptr[s+1]]
    kv_indices: np.ndarray  # [P] int32, KV block ids, each sequence's in order
    kv_last_page_len: np.ndarray  # [S] int32, tokens in each sequence's last page, 1 ..= block_size
    logits_index: np.ndarray  # [R] int32, the tokens whose logits the step returns
    block_size: int

    @property
    def num_tokens(self) -> int:
        return len(self.token_data) // 3

    @property
    def num_seqs(self) -> int:
        return len(self.kv_last_page_len)

    @property
    def is_decode(self) -> bool:
        """Every sequence feeds one token: the step the decode kernels and CUDA graphs serve."""
        return self.num_tokens == self.num_seqs

    @property
    def query_lens(self) -> np.ndarray:
        return np.diff(self.query_start)

    @property
    def context_lens(self) -> np.ndarray:  # [S] KV length of each sequence after this step
        return (np.diff(self.kv_indptr) - 1) * self.block_size + self.kv_last_page_len

    @classmethod
    def empty(cls, block_size: int) -> "HostBatch":
        """No sequence at all: what `padded` and `with_filler` grow the batches of CUDA graph capture from."""
        none = np.zeros(0, np.int32)
        return cls(
            token_data=none,
            query_start=np.zeros(1, np.int32),
            kv_indptr=np.zeros(1, np.int32),
            kv_indices=none,
            kv_last_page_len=none,
            logits_index=none,
            block_size=block_size,
        )

    @classmethod
    def build(
        cls,
        token_ids: list[list[int]],
        start_positions: list[int],
        block_tables: list[list[int]],
        block_size: int,
        logits_rows: np.ndarray | None = None,
        limits: BatchLimits | None = None,
        deferred: np.ndarray | None = None,
    ) -> "HostBatch":
        """`logits_rows`: the sequences whose last token's logits are wanted (all when None).
        `deferred`: the sequences whose one token is FROM_PREVIOUS_STEP; their input id is left 0.
        With `limits`, raises ValueError naming the first bad sequence before anything is built
        that could write outside its blocks or the pool."""
        num_seqs = len(token_ids)
        query_lens = np.fromiter(map(len, token_ids), np.int64, num_seqs)
        starts = np.fromiter(start_positions, np.int64, num_seqs)
        table_lens = np.fromiter(map(len, block_tables), np.int64, num_seqs)
        ends = starts + query_lens
        if limits is not None:
            check_shapes(query_lens, starts, ends, table_lens, block_size, limits)
        query_start = offsets(query_lens)
        num_tokens = int(query_start[-1])
        pages = (ends + block_size - 1) // block_size
        kv_indptr = offsets(pages)
        kv_indices = np.fromiter(
            chain.from_iterable(t[:n] for t, n in zip(block_tables, pages.tolist())), np.int64, int(kv_indptr[-1])
        )
        token_data = np.empty(3 * num_tokens, np.int64)
        tokens = token_thirds(token_data)  # views: writing them fills token_data
        tokens.input_ids[:] = np.fromiter(chain.from_iterable(token_ids), np.int64, num_tokens)
        if deferred is not None and len(deferred):
            firsts = query_start[deferred]  # [D] the one token of each deferred sequence
            bad = (query_lens[deferred] != 1) | (tokens.input_ids[firsts] != FROM_PREVIOUS_STEP)
            if (i := first_true(bad)) is not None:
                raise ValueError(
                    f"sequence {deferred[i]}: a token from the previous step must be its only token, "
                    f"given as FROM_PREVIOUS_STEP ({FROM_PREVIOUS_STEP})"
                )
            tokens.input_ids[firsts] = 0
        if limits is not None:
            check_ids(tokens.input_ids, kv_indices, query_start, kv_indptr, limits)
        if num_tokens == num_seqs:  # decode: one token per sequence
            positions, page_of_token = starts, kv_indptr[1:] - 1
        else:
            seq_of_token = np.repeat(np.arange(num_seqs), query_lens)  # [T]
            positions = np.arange(num_tokens) - query_start[seq_of_token] + starts[seq_of_token]
            page_of_token = kv_indptr[seq_of_token] + positions // block_size
        tokens.positions[:] = positions
        tokens.slot_mapping[:] = kv_indices[page_of_token] * block_size + positions % block_size
        last = query_start[1:] - 1
        return cls(
            token_data=token_data.astype(np.int32),
            query_start=query_start.astype(np.int32),
            kv_indptr=kv_indptr.astype(np.int32),
            kv_indices=kv_indices.astype(np.int32),
            kv_last_page_len=(ends - (pages - 1) * block_size).astype(np.int32),
            logits_index=(last if logits_rows is None else last[logits_rows]).astype(np.int32),
            block_size=block_size,
        )

    def padded(self, num_seqs: int, scratch_block: int) -> "HostBatch":
        """This decode batch grown to `num_seqs` sequences by one-token rows that write and read only
        the scratch block, for a CUDA graph captured at that size; logits_index is unchanged."""
        extra = num_seqs - self.num_seqs
        if not self.is_decode or extra < 0:
            raise ValueError("only a decode batch can be padded, and only to a larger size")
        if extra == 0:
            return self
        zeros, ones = np.zeros(extra, np.int32), np.ones(extra, np.int32)
        last_indptr = self.kv_indptr[-1]
        return replace(
            self,
            token_data=_appended(
                self.token_data,
                TokenColumns(input_ids=zeros, positions=zeros, slot_mapping=ones * (scratch_block * self.block_size)),
            ),
            query_start=np.arange(num_seqs + 1, dtype=np.int32),
            kv_indptr=np.concatenate([self.kv_indptr, last_indptr + np.arange(1, extra + 1, dtype=np.int32)]),
            kv_indices=np.concatenate([self.kv_indices, ones * scratch_block]),
            kv_last_page_len=np.concatenate([self.kv_last_page_len, ones]),
        )

    def with_filler(self, num_tokens: int, scratch_block: int) -> "HostBatch":
        """This batch grown to `num_tokens` tokens by one more sequence, last, of filler tokens (id 0,
        positions from 0) that write and read only the scratch block; logits_index is unchanged.
        Its rows are computed and thrown away: every layer treats rows apart, attention included."""
        extra = num_tokens - self.num_tokens
        if extra < 0:
            raise ValueError(f"a batch of {self.num_tokens} tokens cannot be grown to {num_tokens}")
        if extra == 0:
            return self
        bs = self.block_size
        filler_positions = np.arange(extra, dtype=np.int32)
        pages = -(-extra // bs)
        return replace(
            self,
            token_data=_appended(
                self.token_data,
                TokenColumns(
                    input_ids=np.zeros(extra, np.int32),
                    positions=filler_positions,
                    slot_mapping=scratch_block * bs + filler_positions % bs,
                ),
            ),
            query_start=np.append(self.query_start, num_tokens).astype(np.int32),
            kv_indptr=np.append(self.kv_indptr, self.kv_indptr[-1] + pages).astype(np.int32),
            kv_indices=np.concatenate([self.kv_indices, np.full(pages, scratch_block, np.int32)]),
            kv_last_page_len=np.append(self.kv_last_page_len, extra - (pages - 1) * bs).astype(np.int32),
        )


def token_thirds(token_data: Array) -> TokenColumns[Array]:
    """The input ids, positions and KV slots in [3T] token data (a numpy array or a tensor): views of
    its three thirds, the one place that says which third is which."""
    n = len(token_data) // 3
    return TokenColumns(input_ids=token_data[:n], positions=token_data[n : 2 * n], slot_mapping=token_data[2 * n :])


def _appended(token_data: np.ndarray, more: TokenColumns[np.ndarray]) -> np.ndarray:
    """[3(T+E)] int32 token data: the T tokens of `token_data`, then the E tokens of `more`."""
    old = token_thirds(token_data)
    columns = [old.input_ids, more.input_ids, old.positions, more.positions, old.slot_mapping, more.slot_mapping]
    return np.concatenate(columns)  # in TokenColumns' order, as token_thirds reads them


def offsets(lengths: np.ndarray) -> np.ndarray:
    """[n+1] int64: 0, then the running sums of `lengths` (where each of n ragged runs starts)."""
    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    return starts
