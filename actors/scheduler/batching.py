"""Continuous batching over a paged KV cache: admission, chunked prefill, block grants, preemption.

A plain object, no bus: the scheduler actor feeds it submits, aborts and step outputs, and
publishes the executor commands it returns. Requests join and leave the running batch at every
step. A waiting request takes the longest cached prefix of its tokens from the radix cache and is
admitted only when blocks for the rest of its prompt can be had, so prefill never stalls; decoding
sequences get blocks a few steps ahead. When blocks run out, cached prefixes that no request uses
are evicted first; then the youngest running sequence is preempted (its computed full blocks go to
the cache, to be matched again when it is readmitted), never failed. When the executor reports a
step the device had no memory for, every running sequence is retracted the same way, and fewer
run until steps fit again.

The batcher decides; four plain objects it owns keep the books: the request table
(request_table.py), the KV manager (kv_manager.py), the prefill planner (prefill_planner.py) and
the ledger of drops the executor has not confirmed (drop_ledger.py). Admitting one sequence, and
the command that starts it, are admission.py's.
"""

from actors.lib.memory_backoff import MemoryBackoff
from actors.scheduler.admission import admit
from actors.scheduler.cache_tenancy import TenancyPolicy
from actors.scheduler.drop_ledger import DropLedger
from actors.scheduler.kv_manager import KVManager
from actors.scheduler.prefill_planner import PrefillPlanner
from actors.scheduler.request_table import RequestTable
from actors.scheduler.sequence import Sequence, State
from kernel.tenants import may_abort
from schemas.embed import Pooling
from schemas.errors import Error
from schemas.generate import SamplingParams
from schemas.requests import Tenant
from schemas.step import Command, DropSequence, GrantBlocks, HoldStepping, StepOutput


class ContinuousBatcher:
    """Invariants: an executor that applies every round's commands in order runs exactly the
    sequences in `requests.running`, each on its block table (a dropped run may still report
    updates until the drop ledger settles). No request fails for want of blocks: it waits, or is
    preempted and recomputed, and draws the same tokens as it would alone."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        vocab_size: int,
        max_num_seqs: int = 256,
        max_prefill_tokens: int = 2048,
        lookahead_tokens: int | None = None,
        prefix_caching: bool = True,
        tenancy: TenancyPolicy | None = None,
        host_slots: int = 0,
        kv_fingerprint: str = "",
        disk_segment: str = "",
        kv_block_bytes: int = 0,
    ) -> None:
        self.requests = RequestTable(max_model_len, vocab_size)
        # The weights and KV dtype (what the tiers' blocks belong to), the host segment the disk
        # tier moves blocks through ("": no disk tier), and the bytes of a block of every layer.
        self.kv = KVManager(
            num_blocks,
            block_size,
            prefix_caching,
            tenancy or TenancyPolicy(),
            host_slots,
            kv_fingerprint,
            disk_segment,
            kv_block_bytes,
        )
        self.prefill = PrefillPlanner(max_prefill_tokens)
        self.drops = DropLedger()
        # How many sequences may run: max_num_seqs, halved when the executor runs out of memory.
        self.running_limit = MemoryBackoff(max_num_seqs)
        # The executor steps on its own and may run a few steps ahead of what we have seen.
        self.lookahead_tokens = lookahead_tokens if lookahead_tokens is not None else 2 * block_size
        self.preemptions = 0  # since start
        self.admitting = True  # False while generation is paused (pause.py): arrivals wait in the queue
        self._commands: list[Command] = []  # this round's, in the order the executor applies them

    @property
    def sequences(self) -> dict[str, Sequence]:
        """The requests in flight, by id: the request table's, for callers to read."""
        return self.requests.by_id

    # -- input ----------------------------------------------------------------------------

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        origin: str,
        output_ids: list[int] = (),
        tenant: Tenant = Tenant(),
        fork_of: str | None = None,
        pooling: Pooling | None = None,
    ) -> Error | None:
        """Queues a request. `output_ids` are tokens its client already has (a resubmission after a
        crash): the request continues after them, as if it had been preempted. It reads the cached
        prefixes its `tenant` computed, and public ones. A choice `fork_of`
        another of the same prompt waits for that one's prefill and then shares its blocks. An
        embedding (`pooling`, max_tokens 0) runs as a prompt alone does: its KV is computed, cached
        as any prompt's (the same KV a generation of that prompt computes), and freed at its end."""
        added = self.requests.add(request_id, prompt_ids, params, origin, output_ids, tenant, fork_of, pooling)
        return added if isinstance(added, Error) else None

    def abort(self, request_id: str, keep_output: bool = False) -> Sequence | None:
        """Forgets the request and frees its blocks; returns it, or None if it is not in flight.
        With `keep_output` its client waits for its end: a running one's comes from the executor
        (finish_reason "abort", after every token it drew); the caller ends any other, whose
        tokens are all in `output_ids`, itself."""
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        if seq.state is State.RUNNING:
            self._drop(seq, abort=keep_output)
        self.requests.remove(seq)
        return seq

    def abort_all(self, tenant: Tenant | None) -> list[Sequence]:
        """Aborts, keeping their output, every request of `tenant` (narrowed by its user, if it has
        one), or with None of every tenant; returns them."""
        chosen = [seq for seq in self.requests.by_id.values() if may_abort(tenant, seq.tenant)]
        return [self.abort(seq.request_id, keep_output=True) for seq in chosen]

    def retract_running(self) -> None:
        """Sends every running sequence back to the queue, as a preemption does (a pause's
        "retract"): its KV is freed, its outputs kept, and it is recomputed when readmitted."""
        for seq in list(self.requests.running):
            self._drop(seq)
            self.requests.drain(seq)

    def hold(self, hold: bool) -> None:
        """Holds the executor's stepping (an in-place pause), or releases it, after this round's
        earlier commands."""
        self._commands.append(HoldStepping(hold))

    def on_step(self, output: StepOutput, own_moves: bool = True) -> list[Sequence]:
        """Books one step's results; returns the sequences that finished in it. After a step the
        executor had no memory for, the running sequences are retracted and fewer will run. The
        host slots it reports saved or loaded count only with `own_moves`: of this scheduler's
        commands, not of one before (whose books are gone).

        An update may come from a run of the sequence that was dropped since (a preemption, or an
        abort and a resubmission under the same id). Its tokens still count when they continue
        the sequence exactly where it stands, since every run draws the same tokens; repeats and
        tokens past a gap are ignored, as is the prefill progress of a dropped run.
        """
        for request_id in self.drops.confirm(output.dropped):
            self.requests.drained(request_id)
        finished = []
        for update in output.updates:
            seq = self.requests.get(update.request_id)
            if seq is None or update.finish_reason == "abort":
                continue  # aborted while the step ran; an abort's end follows the abort, which forgot it
            stale = self.drops.unconfirmed(seq.request_id)
            if not stale and seq.record_computed(update):
                self.kv.cache_prefill(seq)
            if not seq.extend_outputs(update) or not update.finish_reason:
                continue
            if stale and seq.state is State.RUNNING:
                self._drop(seq)  # the current run is now surplus
            self.kv.release(seq)  # if it runs: a waiting or draining one holds nothing
            self.requests.remove(seq)
            finished.append(seq)
        if output.out_of_memory is None:
            self.running_limit.step_fit()
        else:  # the executor forgot every sequence it ran, after the tokens above
            self.retract_running()
            self.running_limit.out_of_memory(output.out_of_memory.sequences)
        if own_moves:
            self.kv.saved(output.saved_slots, output.unsaved_slots)
            self.kv.loaded(output.loaded_slots)
        self._commands += self.kv.take_commands()
        return finished

    def reset_executor(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        vocab_size: int,
        host_slots: int = 0,
        kv_fingerprint: str = "",
        disk_segment: str = "",
        kv_block_bytes: int = 0,
    ) -> None:
        """A new executor knows nothing: every started request goes back to the queue and is
        recomputed from its prompt and the tokens it already produced. The host tier's books start
        empty too (v1), though its segment may hold the old executor's blocks; the slots the disk
        tier is moving stay out of use until it answers."""
        # What admins published outlives the executor: the policy keeps it as tokens, whatever the new block size.
        old_kv, old = self.kv, self.kv.cache
        self.kv = KVManager(
            num_blocks, block_size, old.enabled, old.tenancy, host_slots, kv_fingerprint, disk_segment, kv_block_bytes
        )
        self.kv.counts = old_kv.counts
        self.kv.cache.generation = old.generation  # the count of weights seen goes on, in a tree empty as the pool
        if self.kv.host is not None:
            self.kv.host.new_generation(old.generation)
        if self.kv.disk is not None and old_kv.disk is not None:
            self.kv.disk.carry_over(old_kv.disk)
        for seq in self.requests.requeue_all(max_model_len, vocab_size):
            self.kv.forget(seq)
        self.lookahead_tokens = 2 * block_size
        self._commands = []
        self.drops.clear()

    # -- scheduling -----------------------------------------------------------------------

    def schedule(self) -> list[Command]:
        """Decides the next changes to the running batch and returns them as executor commands:
        blocks for decoding sequences first, then prompt chunks of running sequences, then new
        sequences while the prefill budget and the batch's room last."""
        self._grow_decoding()
        budget = self.prefill.budget(self.requests.running)
        for seq in self.requests.running:
            if budget > 0 and seq.prefill_sent < len(seq.prefill_ids):
                budget -= self._send_chunk(seq, budget)
        waiting = self.requests.waiting
        skipped = 0  # the first ones, left in their place for a prefill they will read
        while (
            self.admitting
            and budget > 0
            and skipped < len(waiting)
            and len(self.requests.running) < self.running_limit.limit
        ):
            seq = waiting[skipped]
            if self.prefill.awaits_shared_prefill(seq, self.requests.running, self.kv) or self.kv.waits_for_disk(seq):
                skipped += 1
                # The loads of the pieces it prefetched go now, before anything later in the round
                # (a fork's copy) writes a block the pool may have evicted for them.
                self._commands += self.kv.take_commands()
            elif (started := admit(seq, self.requests, self.kv)) is not None:
                self._commands += started
                budget -= self._send_chunk(seq, budget)
            else:
                break  # first come, first served: nothing overtakes a request short of blocks
        self._commands += self.kv.take_commands()  # with the loads of one that waits, into the tree
        commands, self._commands = self._commands, []
        return commands

    def _grow_decoding(self) -> None:
        """Grants decoding sequences blocks `lookahead_tokens` ahead of their length, preempting
        the youngest running sequences while blocks are short."""
        for seq in list(self.requests.running):
            if seq.state is not State.RUNNING or seq.prefilling:
                continue  # preempted in this loop, or still prefilling
            target = min(seq.total_len + self.lookahead_tokens, seq.max_total_len)
            while (blocks := self.kv.grow(seq, target)) is None:
                victim = self.requests.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if blocks:
                self._commands.append(GrantBlocks(seq.request_id, blocks))

    def _send_chunk(self, seq: Sequence, budget: int) -> int:
        chunk = self.prefill.next_chunk(seq, budget)
        self._commands.append(chunk)
        return len(chunk.token_ids)

    def _drop(self, seq: Sequence, abort: bool = False) -> None:
        """Tells the executor to forget `seq` (and with `abort` to end it for its client) and frees
        its blocks; the ledger counts the drop until the executor confirms it, so updates of the
        dropped run are recognised."""
        self._commands.append(DropSequence(seq.request_id, abort))
        self.drops.sent(seq.request_id)
        self.kv.release(seq)
        self._commands += self.kv.take_commands()

    def _preempt(self, seq: Sequence) -> None:
        self.preemptions += 1
        self._drop(seq)
        self.requests.drain(seq)
