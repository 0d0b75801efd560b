"""The executor actor: owns the model, the KV pool and the running batch, and steps it.

It runs decode steps back to back on its own. Commands from the scheduler are queued as they
arrive and applied between steps, so the bus never sits between two steps. Steps overlap: the
loop applies commands, plans and launches step N+1, then waits for step N's tokens, books and
publishes them while the GPU runs N+1. Each step publishes one `StepOutput` with every sequence's
new tokens (and their logprobs, for the requests that ask), and the ends of aborted sequences.
The launch of each step, and the collection of the one before, are step_launcher.py's.
Weight requests (weight_requests.py) run between steps, once the step in flight is booked.
"""

import asyncio
import uuid

from actors.cache_tier.host_segment import NoRoom
from actors.executor.grammars import Grammars, StepMasks
from actors.executor.kv_moves import KVMoves, MovesDone
from actors.executor.running_batch import RunningBatch
from actors.executor.running_sequence import PlannedInput
from actors.executor.step_launcher import StepLauncher
from actors.executor.step_logprobs import halves_of
from actors.executor.step_memory import StepMemory
from actors.executor.step_watchdog import StepWatchdog
from actors.executor.weight_requests import WeightRequests
from actors.lib.weights_fingerprint import weights_fingerprint
from gpu.runner import ModelRunner
from gpu.step_io import PendingStep
from kernel.actor import Actor, StartRefused
from schemas.executor_weights import ExecutorWeightsRequest
from schemas.step import Commands, DescribeExecutor, ExecutorInfo, OutOfMemory, SequenceUpdate, StepOutput


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class ExecutorActor(Actor):
    """Runs the model: steps the running batch and publishes each step's tokens."""

    name = "executor"
    on_request_path = True

    async def start(self) -> None:
        cfg = self.config.engine
        self.executor_id = uuid.uuid4().hex[:12]
        self.runner = await asyncio.to_thread(
            ModelRunner,
            cfg.model,
            device=pick_device(cfg.device),
            dtype=cfg.dtype,
            num_kv_blocks=cfg.num_kv_blocks,
            block_size=cfg.block_size,
            attention_backend=cfg.attention_backend,
            deterministic=cfg.deterministic,
        )
        pool_tokens = self.runner.num_kv_blocks * self.runner.block_size
        self.max_model_len = min(cfg.max_model_len or self.runner.max_model_len, self.runner.max_model_len, pool_tokens)
        self.work = asyncio.Event()
        loop = asyncio.get_running_loop()
        # A compile done wakes the loop: the sequences that waited for it are planned now.
        self.grammars = Grammars(
            cfg.model,
            self.runner.vocab_size,
            self.runner.eos_token_ids,
            on_compiled=lambda: loop.call_soon_threadsafe(self.work.set),
        )
        self.batch = RunningBatch(
            self.runner.block_size,
            self.max_model_len,
            self.runner.eos_token_ids,
            self.runner.vocab_size,
            self.grammars,
        )
        try:
            self.moves = KVMoves(self.runner, cfg.host_kv_blocks, self.config.supervision.data_dir)
        except NoRoom as error:
            raise StartRefused(f"--host-kv-blocks {cfg.host_kv_blocks}: {error}") from None
        self.scheduler_id: str | None = None
        self.new_epoch = False
        self.pending: list[Commands] = []
        self.step_count = 0
        self.watchdog = StepWatchdog(cfg.step_deadline_s)
        self.memory = StepMemory(cfg.max_prefill_tokens, self.runner.device)
        self.launcher = StepLauncher(self.runner, self.moves, self.watchdog, self.memory, self.log)
        # A restart loads the model from --model again, whatever updates came since: that version.
        fingerprint = weights_fingerprint(cfg.model, str(self.runner.dtype), self.config.supervision.data_dir)
        self.weights = WeightRequests(
            self.runner, cfg.weight_version, fingerprint, self.work.set, cfg.weight_group_join_timeout_s
        )
        await self.bus.subscribe(self.subjects.executor_commands, Commands, self._on_commands)
        await self.bus.subscribe(self.subjects.executor_describe, DescribeExecutor, self._on_describe)
        await self.bus.subscribe(self.subjects.executor_weights, ExecutorWeightsRequest, self.weights.ask)
        await self.bus.publish(self.subjects.executor_info, self.info())
        self.spawn(self._step_loop(), "step_loop")
        self.bus.on_reconnect(self._after_bus_outage)
        self.log.info(
            "model_loaded",
            model=cfg.model,
            blocks=self.runner.num_kv_blocks,
            max_model_len=self.max_model_len,
            device=str(self.runner.device),
            dtype=str(self.runner.dtype),
            deterministic=cfg.deterministic,
        )

    async def stop(self) -> None:
        self.grammars.close()

    @property
    def stuck(self) -> str | None:
        return self.watchdog.stuck()

    @property
    def polls_bus(self) -> bool:
        """On the CPU a step computes in a worker thread, which a polling loop would keep from the GIL."""
        return self.runner.launches_asynchronously

    def info(self) -> ExecutorInfo:
        return ExecutorInfo(
            executor_id=self.executor_id,
            num_blocks=self.runner.num_kv_blocks,
            block_size=self.runner.block_size,
            max_model_len=self.max_model_len,
            vocab_size=self.runner.vocab_size,
            device=str(self.runner.device),
            dtype=str(self.runner.dtype).removeprefix("torch."),
            weight_version=self.weights.version,
            host_kv_slots=self.moves.num_slots,
            host_segment=self.moves.segment.name if self.moves.segment is not None else "",
            weights_fingerprint=self.weights.fingerprint,
            steps=self.step_count,
            kv_block_bytes=self.runner.kv.block_bytes,
        )

    async def _on_describe(self, message: DescribeExecutor, _reply_to: str | None) -> ExecutorInfo:
        if message.resync:
            self._start_new_epoch()
        return self.info()

    async def _after_bus_outage(self) -> None:
        self._start_new_epoch()
        await self.bus.publish(self.subjects.executor_info, self.info())

    def _start_new_epoch(self) -> None:
        """Forgets the batch and answers under a new id, as a restarted executor would: commands
        or outputs the bus lost leave no half-known state behind. The step loop drops the batch
        before it applies the next commands, which come from the scheduler's fresh table."""
        self.executor_id = uuid.uuid4().hex[:12]
        self.pending.clear()
        self.new_epoch = True
        self.work.set()
        self.log.info("executor_new_epoch", executor=self.executor_id)

    async def _on_commands(self, message: Commands, _reply_to: str | None) -> None:
        self.pending.append(message)
        self.work.set()

    def _apply_pending(self) -> None:
        for message in self.pending:
            if message.scheduler_id != self.scheduler_id:
                # A restarted scheduler resubmits what it wants; what the old one started is stale.
                if self.scheduler_id is not None:
                    self.batch.drop_all()
                    self.moves.forget()
                self.scheduler_id = message.scheduler_id
            for command in message.commands:
                self.batch.apply(command)
        self.pending.clear()

    async def _step_loop(self) -> None:
        in_flight: tuple[PendingStep, list[PlannedInput]] | None = None  # launched, not yet booked
        while True:
            if in_flight is None:
                if self.weights.waiting:  # nothing in flight: the weights may change now
                    self.moves.wait()  # the saves read the pool, which the requests may release
                    await self.weights.run_waiting()
                    self.work.set()  # the batch steps on where it stopped
                await self.moves.idle(self.work)
            self.work.clear()
            if self.new_epoch:
                self.new_epoch, self.scheduler_id = False, None
                self.batch.drop_all()  # the step in flight books nothing: its sequences are gone
                self.batch.take_dropped()  # the scheduler forgets them too: nothing to confirm
                self.moves.forget()
            executor_id = self.executor_id  # outputs of this step belong to the epoch it started in
            self._apply_pending()
            if self.weights.waiting or self.weights.asleep:
                # Launch nothing more: the step in flight is the last before the weight requests, and
                # released memory is read by no step until it is resumed (whose request wakes this loop).
                # Saves are made now, while the pool holds their KV, or never (abandoned).
                self.moves.apply(self.batch.take_saves())
                inputs, plan, copies = [], [], []
            else:
                inputs, plan = self.batch.plan_step(self.memory.prefill_budget)
                copies = self.batch.take_copies()
            updates, out_of_memory = [], None
            if inputs or copies or in_flight:
                previous = in_flight[0] if in_flight else None
                masks = StepMasks.of(inputs, plan, in_flight, self.grammars)  # of its constrained draws
                launched, tokens, out_of_memory = await self.launcher.step(copies, inputs, plan, previous, masks)
                if in_flight:
                    pending, booked = in_flight
                    logprobs = pending.logprobs() if self.batch.asks_logprobs(booked) else None
                    updates = self.batch.book(booked, tokens, logprobs, pending.pooled())
                # Booking cannot let a sequence move that this plan left out (only blocks can), so with
                # nothing launched the loop waits for the next commands.
                in_flight = (launched, plan) if launched else None
            if out_of_memory:
                self.batch.forget_all()  # after booking the step before: its tokens are whole
            updates += self.batch.take_ended()
            dropped = self.batch.take_dropped()
            moved = self.moves.take_done()
            if updates or dropped or out_of_memory or any(moved):
                self.step_count += 1
                await self._publish_step(executor_id, updates, dropped, out_of_memory, moved)
                # nats-py's flusher task writes it: let it run now, before the next launch keeps the
                # host busy (this loop on a GPU, the GIL on the CPU), or the tokens wait until it ends.
                await asyncio.sleep(0)

    async def _publish_step(
        self,
        executor_id: str,
        updates: list[SequenceUpdate],
        dropped: list[str],
        out_of_memory: OutOfMemory | None,
        moved: MovesDone,
    ) -> None:
        """Publishes the step's output in as many messages as the bus needs, in order: the updates
        halved until each part fits in half a bus message (a tokenizer adds the text of the tokens
        the logprobs name), one update's prompt logprobs halved too; the drops and a failed step's
        report go with the last part (every token they drew is in it or before it), as do the host
        slots saved, abandoned or loaded since the last output, with the scheduler whose commands
        moved them (all moves of another were forgotten when its successor's came). The weights
        change only with no step in flight, so those that launched the booked step serve now."""
        version = self.weights.version
        await self.bus.publish_in_parts(
            self.subjects.step_outputs,
            updates,
            lambda part, last: StepOutput(
                executor_id,
                self.step_count,
                part,
                dropped if last else [],
                version,
                out_of_memory=out_of_memory if last else None,
                saved_slots=moved.saved if last else [],
                unsaved_slots=moved.abandoned if last else [],
                loaded_slots=moved.loaded if last else [],
                scheduler_id=self.scheduler_id or "",
            ),
            limit_bytes=self.bus.max_payload_bytes // 2,
            halves=halves_of,
        )
