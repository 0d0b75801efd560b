"""The executor's KV moves before a step, in the order the scheduler sent them: copies inside the
pool (a forked choice's block), saves of blocks to the host tier's slots and loads back.

The host tier's memory is one shared-memory segment (actors/cache_tier/host_segment.py) named after
the data dir and the KV geometry, so a restarted executor maps the same one (v1: the scheduler
forgets what it holds all the same). Saves and loads run on the transfer's own streams and are
reported once done with their slots (`take_done`): a save's block, and a load's slots, stay out of
other use in the scheduler's books until then, since the cache_tier process writes slots it is
given from outside this process's streams. A load lands layer by layer under the next step, which
attends over each layer once it has landed (gpu/layer_arrivals.py).
"""

import asyncio
from typing import NamedTuple

import torch

from actors.cache_tier.host_segment import HostSegment, segment_prefix
from actors.executor.running_batch import KVMove
from gpu.kv_cache import KVCache
from gpu.kv_transfer import KVTransfer, Transfer
from gpu.runner import ModelRunner
from schemas.step import CopyBlock, LoadBlocks, SaveBlocks

# With copies under way and nothing to step, how often the executor's loop looks for their end.
SAVE_POLL_S = 0.002


class MovesDone(NamedTuple):
    """The host slots of the copies done since the last report, for the next StepOutput."""

    saved: list[int]
    abandoned: list[int]  # saves never made: the pool was released first
    loaded: list[int]  # read by their loads; a slot loaded twice is named twice


class KVMoves:
    """Applies `KVMove`s to `runner`'s pool; with `host_slots` > 0, over a host tier of that many
    slots (one block of every layer each)."""

    def __init__(self, runner: ModelRunner, host_slots: int, data_dir: str) -> None:
        self.runner = runner
        self.num_slots = host_slots
        self.segment: HostSegment | None = None
        self.transfer: KVTransfer | None = None
        self._saving: list[tuple[Transfer, list[int]]] = []  # in order of issue: (copy, its slots)
        self._loading: list[tuple[Transfer, list[int]]] = []  # the same, of loads
        self._abandoned: list[int] = []  # slots whose save will never be made (the pool was released)
        if host_slots <= 0:
            return
        kv: KVCache = runner.kv
        layer = kv.layers[0]  # [num_blocks + 1, 2, block_size, kv_heads, head_dim]
        slot_bytes = len(kv.layers) * layer[0].numel() * layer.element_size()
        self.segment = HostSegment.create(f"{segment_prefix(data_dir)}{slot_bytes}", host_slots, slot_bytes)
        self.transfer = KVTransfer(kv, torch.from_numpy(self.segment.slots()))

    def apply(self, moves: list[KVMove]) -> None:
        """Makes `moves` in order; consecutive copies go to the pool together."""
        copies: list[tuple[int, int]] = []
        for move in moves:
            if not isinstance(move, CopyBlock) and copies:
                self.runner.copy_blocks(copies)
                copies = []
            match move:
                case CopyBlock(source, target):
                    copies.append((source, target))
                case SaveBlocks(blocks, slots):
                    self._save(blocks, slots)
                case LoadBlocks(slots, blocks):
                    self._loading.append((self._host_tier("LoadBlocks").load(slots, blocks), slots))
        self.runner.copy_blocks(copies)

    def _save(self, blocks: list[int], slots: list[int]) -> None:
        if self.runner.kv.released:
            self._abandoned += slots  # the pool's content is gone: nothing true to save
        else:
            self._saving.append((self._host_tier("SaveBlocks").save(blocks, slots), slots))

    def _host_tier(self, command: str) -> KVTransfer:
        if self.transfer is None:
            raise ValueError(f"{command}: this executor has no host tier (--host-kv-blocks 0)")
        return self.transfer

    def take_done(self) -> MovesDone:
        """The slots of the copies done since the last call; each kind finishes in the order issued."""
        abandoned, self._abandoned = self._abandoned, []
        return MovesDone(self._take_finished(self._saving), abandoned, self._take_finished(self._loading))

    @staticmethod
    def _take_finished(under_way: list[tuple[Transfer, list[int]]]) -> list[int]:
        slots: list[int] = []
        while under_way and under_way[0][0].done():
            slots += under_way.pop(0)[1]
        return slots

    async def idle(self, work: asyncio.Event) -> None:
        """Waits for `work` (the next commands); with copies under way, no longer than SAVE_POLL_S,
        so that their end is reported though nothing steps."""
        if not self._saving and not self._loading:
            await work.wait()
            return
        try:
            await asyncio.wait_for(work.wait(), SAVE_POLL_S)
        except TimeoutError:
            pass

    def wait(self) -> None:
        """Blocks until every copy under way is done (before the pool may be released)."""
        for transfer, _ in self._saving + self._loading:
            transfer.wait()

    def forget(self) -> None:
        """A new scheduler, or a new epoch: the copies under way are nobody's to report (the new
        owner's books start without them)."""
        self.wait()  # saves still read blocks a new owner may reuse, and loads write them
        self._saving.clear()
        self._loading.clear()
        self._abandoned.clear()
