"""One step's input on the device: a `HostBatch` (gpu/batch.py) copied over in one transfer, with the
host arrays the attention planners read beside the tensors the kernels read.

The runner uploads through its reused pinned buffer (gpu/staging.py), and other small bundles (the
sampling settings, the logprobs asked) ride along in the same copy; without a buffer (the CPU) the
arrays are wrapped as tensors in place.
"""

from dataclasses import dataclass
from typing import Generic, NamedTuple

import torch

from gpu.batch import HostBatch, token_thirds
from gpu.staging import Array, Bundle, Staging, on_cpu


class BatchArrays(NamedTuple, Generic[Array]):
    """The arrays of a `HostBatch` that the device reads: the bundle `ForwardBatch.from_host` uploads."""

    token_data: Array  # [3T] int32
    query_start: Array  # [S+1] int32
    kv_indptr: Array  # [S+1] int32
    kv_indices: Array  # [P] int32
    kv_last_page_len: Array  # [S] int32
    logits_index: Array  # [R] int32


@dataclass(frozen=True)
class ForwardBatch:
    """A `HostBatch` on the device, plus the host arrays kernel planners read (pinned when staged)."""

    token_data: torch.Tensor  # [3T] int32: the three below, back to back
    input_ids: torch.Tensor  # [T] int32
    positions: torch.Tensor  # [T] int32
    slot_mapping: torch.Tensor  # [T] int32
    query_start: torch.Tensor  # [S+1] int32
    kv_indptr: torch.Tensor  # [S+1] int32
    kv_indices: torch.Tensor  # [P] int32
    kv_last_page_len: torch.Tensor  # [S] int32
    logits_index: torch.Tensor | None  # [R] int32; None: every token's logits (a CUDA-graph decode)
    host: HostBatch
    host_query_start: torch.Tensor  # [S+1] int32 on the CPU
    host_kv_indptr: torch.Tensor  # [S+1] int32 on the CPU
    host_kv_last_page_len: torch.Tensor  # [S] int32 on the CPU

    @property
    def block_size(self) -> int:
        return self.host.block_size

    @property
    def num_seqs(self) -> int:
        return self.host.num_seqs

    @classmethod
    def from_host(
        cls, host: HostBatch, staging: Staging | None = None, extras: tuple[Bundle | None, ...] = ()
    ) -> tuple["ForwardBatch", list[Bundle | None]]:
        """Copies `host`, and the `extras` bundles (NamedTuples of numpy arrays, or None) that ride
        along, to the staging buffer's device in one transfer; returns the batch and the extras on
        the device, in order. Without staging, wraps the arrays as CPU tensors."""
        arrays = BatchArrays(
            token_data=host.token_data,
            query_start=host.query_start,
            kv_indptr=host.kv_indptr,
            kv_indices=host.kv_indices,
            kv_last_page_len=host.kv_last_page_len,
            logits_index=host.logits_index,
        )
        if staging is None:
            device, *extras = map(on_cpu, (arrays, *extras))
            on_host = _itself  # the planners read the kernels' CPU tensors
        else:
            device, *extras = staging.upload(arrays, *extras)
            on_host = staging.pinned
        tokens = token_thirds(device.token_data)
        batch = cls(
            token_data=device.token_data,
            input_ids=tokens.input_ids,
            positions=tokens.positions,
            slot_mapping=tokens.slot_mapping,
            query_start=device.query_start,
            kv_indptr=device.kv_indptr,
            kv_indices=device.kv_indices,
            kv_last_page_len=device.kv_last_page_len,
            logits_index=device.logits_index,
            host=host,
            host_query_start=on_host(device.query_start),
            host_kv_indptr=on_host(device.kv_indptr),
            host_kv_last_page_len=on_host(device.kv_last_page_len),
        )
        return batch, extras

    @classmethod
    def build(
        cls,
        token_ids: list[list[int]],
        start_positions: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str,
    ) -> "ForwardBatch":
        """A batch returning each sequence's last-token logits, on `device` (for tests and tools;
        the runner stages its steps through one reused buffer)."""
        host = HostBatch.build(token_ids, start_positions, block_tables, block_size)
        device = torch.device(device)
        staging = Staging(device) if device.type == "cuda" else None
        batch, _ = cls.from_host(host, staging)
        return batch


def _itself(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
