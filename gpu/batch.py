"""One model step's input: the new tokens of every sequence, flattened, plus the paged-KV metadata.

Prefill, a prompt chunk on top of cached KV and decode are one case: sequence s feeds `query_len`
new tokens at positions `context_len - query_len ..< context_len`. Everything is built on the host
in one pass and copied to the device once, so the model itself never waits on the host.
"""

from dataclasses import dataclass
from itertools import accumulate, chain

import torch


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64, the new tokens of all sequences back to back
    positions: torch.Tensor  # [T] int64, each token's position in its sequence
    slot_mapping: torch.Tensor  # [T] int64, flat KV slot (block_id * block_size + offset) each token writes
    query_start: torch.Tensor  # [S+1] int32, sequence s owns tokens query_start[s] ..< query_start[s+1]
    context_lens: torch.Tensor  # [S] int32, KV length of each sequence after this step (cached + new)
    block_tables: torch.Tensor  # [S, max_blocks] int32, KV block ids in order, padded with 0
    last_token_index: torch.Tensor  # [S] int64, index into T of each sequence's last new token
    block_size: int
    # Host copies, so backends can plan (or loop, for the reference one) without a device sync.
    query_lens: list[int]
    context_lens_host: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @classmethod
    def build(
        cls,
        token_ids: list[list[int]],
        start_positions: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str,
    ) -> "ForwardBatch":
        """Callers validate first: non-empty token lists, block tables covering every new token."""
        query_lens = [len(tokens) for tokens in token_ids]
        context_lens = [start + n for start, n in zip(start_positions, query_lens)]
        starts = [0, *accumulate(query_lens)]
        max_blocks = max(len(table) for table in block_tables)

        query_start = torch.tensor(starts, dtype=torch.int32)  # [S+1]
        tables = torch.tensor([table + [0] * (max_blocks - len(table)) for table in block_tables], dtype=torch.int32)
        seq_of_token = torch.repeat_interleave(torch.arange(len(query_lens)), torch.tensor(query_lens))  # [T]
        offset_in_query = torch.arange(starts[-1]) - query_start[seq_of_token]  # [T]
        positions = torch.tensor(start_positions, dtype=torch.int64)[seq_of_token] + offset_in_query  # [T]
        blocks = tables[seq_of_token, positions // block_size].long()  # [T]
        slot_mapping = blocks * block_size + positions % block_size  # [T]

        def to_device(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        return cls(
            input_ids=to_device(torch.tensor(list(chain.from_iterable(token_ids)), dtype=torch.int64)),
            positions=to_device(positions),
            slot_mapping=to_device(slot_mapping),
            query_start=to_device(query_start),
            context_lens=to_device(torch.tensor(context_lens, dtype=torch.int32)),
            block_tables=to_device(tables),
            last_token_index=to_device(query_start[1:].long() - 1),
            block_size=block_size,
            query_lens=query_lens,
            context_lens_host=context_lens,
        )
