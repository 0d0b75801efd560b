"""Continuous batching over a paged KV cache: admission, chunked prefill, block grants, preemption.

A plain object, no bus: the scheduler actor feeds it submits, aborts and step outputs, and
publishes the executor commands it returns. Requests join and leave the running batch at every
step. A waiting request takes the longest cached prefix of its tokens from the radix cache and is
admitted only when blocks for the rest of its prompt can be had, so prefill never stalls; decoding
sequences get blocks a few steps ahead. When blocks run out, cached prefixes that no request uses
are evicted first; then the youngest running sequence is preempted (its computed full blocks go to
the cache, to be matched again when it is readmitted), never failed.
"""

import bisect
import itertools
from collections import Counter, deque

import msgspec

from actors.scheduler.block_pool import BlockPool
from actors.scheduler.cache_tenancy import TenancyPolicy
from actors.scheduler.radix_cache import CacheStats, MatchResult, Node, RadixCache
from actors.scheduler.sequence import Sequence, State
from schemas.admin import CacheReport, PrefixPublished, SchedulerStats
from schemas.errors import Error
from schemas.generate import SamplingParams
from schemas.step import Command, CopyBlock, DropSequence, GrantBlocks, PrefillChunk, StartSequence, StepOutput

# Prompt tokens sent ahead of what the executor has reported computed, in steps' budgets. The
# executor plans a step as soon as it publishes the output of the step before last, so the commands
# answering an output reach it two plans later: the chunks it needs meanwhile, for the step on the
# device, the one launched behind it and the next, must already be there, or it runs steps with
# less prefill than the budget allows.
PREFILL_STEPS_AHEAD = 3
# The match of a sequence that took nothing from the cache (a forked choice): nothing to unlock.
NO_PREFIX = MatchResult(Node((), [], None), [], 0)


class ContinuousBatcher:
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
    ) -> None:
        self.pool = BlockPool(num_blocks)
        self.cache = RadixCache(self.pool, block_size, enabled=prefix_caching, tenancy=tenancy or TenancyPolicy())
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        # The executor steps on its own and may run a few steps ahead of what we have seen.
        self.lookahead_tokens = lookahead_tokens if lookahead_tokens is not None else 2 * block_size
        self.sequences: dict[str, Sequence] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self._arrivals = itertools.count()
        self._commands: list[Command] = []
        self._unacked_drops: Counter[str] = Counter()  # drops sent that the executor has not confirmed
        self.preemptions = 0  # since start

    # -- input ----------------------------------------------------------------------------

    def validate(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> Error | None:
        if request_id in self.sequences:
            return Error("invalid_request", f"request id {request_id!r} is already in flight")
        if not prompt_ids:
            return Error("invalid_request", "the prompt is empty", param="prompt")
        if params.max_tokens is None:
            return Error(
                "context_length_exceeded",
                f"This model's maximum context length is {self.max_model_len} tokens, and the prompt has {len(prompt_ids)}.",
                param="prompt",
            )
        if params.max_tokens <= 0:
            return Error("invalid_request", "max_tokens must be at least 1", param="max_tokens")
        bad = next((t for t in prompt_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            return Error("invalid_request", f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})", param="prompt")
        total = len(prompt_ids) + params.max_tokens
        if total > self.max_model_len:
            return Error(
                "context_length_exceeded",
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{total} tokens ({len(prompt_ids)} in the prompt, {params.max_tokens} in the completion).",
                param="max_tokens" if len(prompt_ids) < self.max_model_len else "prompt",
            )
        return None

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        origin: str,
        output_ids: list[int] = (),
        cache_namespace: str = "",
        fork_of: str | None = None,
    ) -> Error | None:
        """Queues a request. `output_ids` are tokens its client already has (a resubmission after a
        crash): the request continues after them, as if it had been preempted. `cache_namespace` is
        its tenant: it reads cached prefixes that tenant computed, and public ones. A choice `fork_of`
        another of the same prompt waits for that one's prefill and then shares its blocks."""
        if params.max_tokens is None and len(prompt_ids) < self.max_model_len:
            params = msgspec.structs.replace(params, max_tokens=self.max_model_len - len(prompt_ids))
        error = self.validate(request_id, prompt_ids, params)
        if error:
            return error
        seq = Sequence(request_id, list(prompt_ids), params, origin, next(self._arrivals), list(output_ids),
                       cache_namespace, fork_of)
        self.sequences[request_id] = seq
        self.waiting.append(seq)
        return None

    def abort(self, request_id: str) -> Sequence | None:
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return None
        if seq.state is State.WAITING:
            self.waiting.remove(seq)
        elif seq.state is State.RUNNING:
            self._drop(seq)
            self.running.remove(seq)
        return seq

    def on_step(self, output: StepOutput) -> list[Sequence]:
        """Books one step's results; returns the sequences that finished in it.

        An update may come from a run of the sequence that was dropped since (a preemption, or an
        abort and a resubmission under the same id). Its tokens still count when they continue
        the sequence exactly where it stands, since every run draws the same tokens; repeats and
        tokens past a gap are ignored, as is the prefill progress of a dropped run.
        """
        # The drops an output confirms took effect before its step ran.
        for request_id in output.dropped:
            self._unacked_drops[request_id] -= 1
            if self._unacked_drops[request_id] <= 0:
                del self._unacked_drops[request_id]
                seq = self.sequences.get(request_id)
                if seq is not None and seq.state is State.DRAINING:
                    seq.state = State.WAITING
                    arrivals = [s.arrival for s in self.waiting]
                    self.waiting.insert(bisect.bisect(arrivals, seq.arrival), seq)
        finished = []
        for update in output.updates:
            seq = self.sequences.get(update.request_id)
            if seq is None:
                continue  # aborted while the step ran
            stale = self._unacked_drops[update.request_id] > 0
            if not stale:
                was_prefilling = seq.prefilling
                seq.prefill_done += update.prefilled_tokens
                seq.computed_len = max(seq.computed_len, seq.prefill_done)
                if was_prefilling and not seq.prefilling:
                    self._cache_prompt(seq)
                if update.token_ids and update.output_index <= len(seq.output_ids):
                    # the run has fed every token before the one it drew
                    seq.computed_len = max(seq.computed_len, len(seq.prompt_ids) + update.output_index)
            if update.output_index != len(seq.output_ids):
                continue
            seq.output_ids += update.token_ids
            if update.finish_reason:
                if stale and seq.state is State.RUNNING:
                    self._drop(seq)  # the current run is now surplus
                self._finish(seq)
                finished.append(seq)
        return finished

    def reset_executor(self, num_blocks: int, block_size: int, max_model_len: int, vocab_size: int) -> None:
        """A new executor knows nothing: every started request goes back to the queue and is
        recomputed from its prompt and the tokens it already produced."""
        self.pool = BlockPool(num_blocks)
        # What admins published outlives the executor: it is kept as tokens, whatever the new block size.
        self.cache = RadixCache(self.pool, block_size, enabled=self.cache.enabled, tenancy=self.cache.tenancy)
        self.block_size, self.max_model_len, self.vocab_size = block_size, max_model_len, vocab_size
        self.lookahead_tokens = 2 * block_size
        for seq in self.running + [s for s in self.sequences.values() if s.state is State.DRAINING]:
            seq.blocks, seq.cached = [], None
            seq.state = State.WAITING
        self.running = []
        self.waiting = deque(sorted((s for s in self.sequences.values()), key=lambda s: s.arrival))
        self._commands = []
        self._unacked_drops.clear()  # the new executor has nothing to confirm

    def stats(self) -> SchedulerStats:
        cache = self.cache.stats()
        return SchedulerStats(
            len(self.waiting), len(self.running), self.pool.num_blocks, self.pool.num_free,
            cache.cached_blocks, cache.evictable_blocks, cache.hit_tokens, cache.queried_tokens, self.preemptions,
        )

    def cache_stats(self) -> CacheStats:
        return self.cache.stats()

    def cache_report(self) -> CacheReport:
        """GET /admin/cache: a walk of the tree, for people, not for the hot loop."""
        usage = self.cache.usage()
        in_use = len({b for seq in self.running for b in seq.blocks})
        hit_rate = usage.hit_tokens / usage.queried_tokens if usage.queried_tokens else 0.0
        return CacheReport(
            self.pool.num_blocks, usage.free_blocks, usage.cached_blocks, usage.evictable_blocks, in_use,
            usage.public_blocks, usage.private_blocks, usage.hit_tokens, usage.queried_tokens, hit_rate,
        )

    def publish_prefix(self, tokens: list[int]) -> PrefixPublished:
        opened = self.cache.publish(tokens)
        return PrefixPublished(len(tokens) // self.block_size * self.block_size, opened)

    def flush_cache(self) -> int:
        """Frees every cached block that no running request uses (stale after a weight update,
        say); returns how many."""
        return self.cache.flush()

    # -- scheduling -----------------------------------------------------------------------

    def schedule(self) -> list[Command]:
        """Decides the next changes to the running batch and returns them as executor commands."""
        self._grow_decoding()
        in_flight = sum(s.prefill_sent - s.prefill_done for s in self.running)
        budget = PREFILL_STEPS_AHEAD * self.max_prefill_tokens - in_flight
        for seq in self.running:
            if budget <= 0:
                break
            if seq.prefill_sent < len(seq.prefill_ids):
                budget -= self._send_chunk(seq, budget)
        deferred = []
        while budget > 0 and self.waiting and len(self.running) < self.max_num_seqs:
            if self._awaits_shared_prefill(self.waiting[0]):
                deferred.append(self.waiting.popleft())
                continue
            if not self._admit(self.waiting[0]):
                break
            budget -= self._send_chunk(self.waiting.popleft(), budget)
        self.waiting.extendleft(reversed(deferred))  # first in the queue again, in their order
        commands, self._commands = self._commands, []
        return commands

    def _awaits_shared_prefill(self, seq: Sequence) -> bool:
        """Whether a running request of the same tenant is computing blocks of `seq`'s tokens that
        the cache lacks. Admitted once that prefill is done, `seq` reads them from the cache instead
        of computing them again: requests that arrive together with one system prompt compute it once."""
        peers = [o for o in self.running if o.prefilling and o.tenant == seq.tenant]
        if seq.fork_of or not self.cache.enabled or not peers:
            return False  # and no tree walk beside _admit's, in the common case
        tokens = seq.prompt_ids + seq.output_ids
        cached = self.cache.match(tokens, tenant=seq.tenant)
        end = (len(cached.blocks) + 1) * self.block_size  # one block past what the cache has
        if end >= len(tokens):
            return False
        head = tokens[:end]
        return any(o.prefill_ids[:end] == head for o in peers)

    def _cache_prompt(self, seq: Sequence) -> None:
        """Stores the full blocks of a prefill that just completed, so requests admitted while this
        one still runs read them. Where the tree now holds this request's own blocks, the request
        holds that longer prefix against eviction, as it held the matched one; where it kept blocks
        another request computed for the same tokens, this one goes on reading its own copies."""
        full = min(seq.prefill_done // self.block_size, len(seq.blocks))
        if full <= len(seq.cached.blocks):
            return
        tokens = seq.prefill_ids[: full * self.block_size]
        self.cache.insert(tokens, seq.blocks[:full], tenant=seq.tenant)
        # match leaves the last token it is given uncached: give one past the stored blocks.
        stored = self.cache.match(tokens + [0], tenant=seq.tenant)
        if stored.blocks != seq.blocks[: len(stored.blocks)]:
            return
        self.cache.lock(stored.node)
        self.cache.unlock(seq.cached.node)
        seq.cached = stored

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _grow_decoding(self) -> None:
        for seq in list(self.running):
            if seq.state is not State.RUNNING or seq.prefilling:
                continue
            target = min(seq.total_len + self.lookahead_tokens, seq.max_total_len)
            need = self._blocks_for(target) - len(seq.blocks)
            while need > 0:
                blocks = self._allocate(need)
                if blocks is not None:
                    seq.blocks += blocks
                    self._commands.append(GrantBlocks(seq.request_id, blocks))
                    break
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break

    def _admit(self, seq: Sequence) -> bool:
        """Starts `seq` on the executor if blocks for all its uncached tokens can be had. It reads
        the cached prefix's shared blocks and writes only its own, after them."""
        parent = self.sequences.get(seq.fork_of) if seq.fork_of and not seq.output_ids else None
        if parent is not None and (parent.prefilling or parent.state is State.DRAINING):
            return False  # the prompt is being computed, once for every choice
        if parent is not None and parent.state is State.RUNNING:
            return self._admit_fork(seq, parent)
        tokens = seq.prompt_ids + seq.output_ids
        if not seq.looked_up:  # one request is one lookup, however often it waits for blocks or is readmitted
            self.cache.record_lookup(tokens, tenant=seq.tenant)
            seq.looked_up = True
        cached = self.cache.match(tokens, tenant=seq.tenant)
        self.cache.lock(cached.node)  # so that _allocate cannot evict it
        blocks = self._allocate(self._blocks_for(len(tokens) + 1) - len(cached.blocks))
        if blocks is None:
            self.cache.unlock(cached.node)
            return False
        self.pool.retain(cached.blocks)
        seq.state = State.RUNNING
        seq.blocks, seq.cached = cached.blocks + blocks, cached
        seq.prefill_ids = tokens
        seq.prefill_sent = seq.prefill_done = seq.computed_len = cached.num_tokens
        self.running.append(seq)
        self._commands.append(
            StartSequence(seq.request_id, seq.params, list(seq.blocks), len(seq.output_ids), cached.num_tokens)
        )
        return True

    def _admit_fork(self, seq: Sequence, parent: Sequence) -> bool:
        """Starts `seq` on the blocks of `parent`, whose prefill of the same prompt is done: the
        blocks before the prompt's last token are shared; the one holding that token is copied, and
        the token computed again, to give this choice its own logits and room for its own tokens."""
        last = len(seq.prompt_ids) - 1
        shared = parent.blocks[: last // self.block_size]
        own = self._allocate(self._blocks_for(last + 2) - len(shared))
        if own is None:
            return False
        self.pool.retain(shared)
        seq.state = State.RUNNING
        seq.blocks, seq.cached = shared + own, NO_PREFIX
        seq.prefill_ids = list(seq.prompt_ids)
        seq.prefill_sent = seq.prefill_done = seq.computed_len = last
        self.running.append(seq)
        self._commands.append(CopyBlock(parent.blocks[len(shared)], own[0]))
        self._commands.append(StartSequence(seq.request_id, seq.params, list(seq.blocks), 0, last))
        return True

    def _allocate(self, count: int) -> list[int] | None:
        """Fresh blocks, evicting cached prefixes that no request uses if too few are free; None
        (and nothing evicted) if even that would not be enough."""
        short = count - self.pool.num_free
        if short > 0:
            if short > self.cache.stats().evictable_blocks:
                return None
            self.cache.evict(short)
            if self.pool.num_free < count:
                return None  # some evicted blocks were also the shared prompt of running choices
        return self.pool.allocate(count)

    def _send_chunk(self, seq: Sequence, budget: int) -> int:
        start = seq.prefill_sent
        end = min(len(seq.prefill_ids), start + budget)
        self._commands.append(
            PrefillChunk(seq.request_id, seq.prefill_ids[start:end], start, last=end == len(seq.prefill_ids))
        )
        seq.prefill_sent = end
        return end - start

    def _drop(self, seq: Sequence) -> None:
        """Tells the executor to forget `seq` and frees its blocks; we count the drop until the
        executor confirms it, so updates of the dropped run are recognised."""
        self._commands.append(DropSequence(seq.request_id))
        self._unacked_drops[seq.request_id] += 1
        self._release(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.preemptions += 1
        self._drop(seq)
        self.running.remove(seq)
        seq.state = State.DRAINING

    def _finish(self, seq: Sequence) -> None:
        del self.sequences[seq.request_id]
        if seq.state is State.RUNNING:
            self._release(seq)
            self.running.remove(seq)
        elif seq.state is State.WAITING:
            self.waiting.remove(seq)

    def _release(self, seq: Sequence) -> None:
        """Leaves the full blocks whose KV is computed to the cache, then drops the sequence's own
        references (so a block the cache already had for the same tokens is freed)."""
        if seq.cached is None:
            return  # released already: a finish that follows a drop
        full = min(seq.computed_len // self.block_size, len(seq.blocks))
        tokens = (seq.prompt_ids + seq.output_ids)[: full * self.block_size]
        self.cache.insert(tokens, seq.blocks[:full], tenant=seq.tenant)
        self.cache.unlock(seq.cached.node)
        self.pool.release(seq.blocks)
        seq.blocks, seq.cached = [], None
