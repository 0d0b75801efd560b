"""Start reading here: one whole step of the server in one process, with no bus.

`InProcessEngine.step` is the server's step in a screenful: the scheduler's batcher decides
(`ContinuousBatcher.schedule`), the executor's running batch applies the commands and plans the
model step (`RunningBatch.apply`, `plan_step`), the runner launches it (`ModelRunner.launch`), the
batch books the tokens drawn (`book`) and the batcher books the step output (`on_step`). Each actor
wraps one of these plain objects and carries the messages between them over the bus; this module
composes them directly, so it is no actor and belongs to no actor's package (docs/structure.md
walks the same step through the actors).

It is the reference that tests compare the actor system against, and the in-process path the
benchmark measures. Like the executor actor it overlaps steps: each `step` launches the next model
step, then books the one launched before (`overlap=False` books each step before planning the
next: the reference, and the old timing).
"""

import time
from collections.abc import Callable

import numpy as np

from actors.executor.grammars import Grammars, StepMasks
from actors.executor.running_batch import RunningBatch
from actors.executor.running_sequence import PlannedInput
from actors.scheduler.batching import ContinuousBatcher
from actors.scheduler.sequence import State
from gpu.runner import ModelRunner
from gpu.step_io import PendingStep
from schemas.embed import Pooling
from schemas.errors import Error
from schemas.generate import SamplingParams
from schemas.requests import Tenant
from schemas.step import StepOutput

IDLE_WAIT_S = 0.001  # a round with nothing to launch waits this long before the next


class InProcessEngine:
    """`grammars`: what constrained requests (structured output) compile their constraints with, for
    the served tokenizer; None: such requests fail."""

    def __init__(
        self,
        runner: ModelRunner,
        max_num_seqs: int = 256,
        max_prefill_tokens: int = 2048,
        prefix_caching: bool = True,
        overlap: bool = True,
        grammars: Grammars | None = None,
    ) -> None:
        self.runner = runner
        self.overlap = overlap
        self.max_prefill_tokens = max_prefill_tokens
        max_len = min(runner.max_model_len, runner.num_kv_blocks * runner.block_size)
        self.batcher = ContinuousBatcher(
            runner.num_kv_blocks,
            runner.block_size,
            max_len,
            runner.vocab_size,
            max_num_seqs,
            max_prefill_tokens,
            prefix_caching=prefix_caching,
        )
        self.grammars = grammars
        self.batch = RunningBatch(runner.block_size, max_len, runner.eos_token_ids, runner.vocab_size, self.grammars)
        self.outputs: dict[str, list[int]] = {}
        self.finish_reasons: dict[str, str] = {}
        self.cached_tokens: dict[str, int] = {}  # prompt tokens served from the prefix cache at the first start
        self.embeddings: dict[str, np.ndarray] = {}  # an embedding's pooled vector [hidden] float32, not normalised
        self.steps = 0
        self.in_flight: tuple[PendingStep, list[PlannedInput]] | None = None  # launched, not yet booked
        # Host seconds the last step's launch took (0.0: it launched nothing). With overlap the GPU
        # runs the step before meanwhile, so this is what the host adds only where it is the longer.
        self.launch_s = 0.0

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        tenant: Tenant = Tenant(),
        output_ids: list[int] = (),
        fork_of: str | None = None,
        pooling: Pooling | None = None,
    ) -> Error | None:
        """`pooling` (with max_tokens 0): an embedding, whose vector lands in `embeddings`."""
        error = self.batcher.submit(
            request_id,
            prompt_ids,
            params,
            origin="in-process",
            output_ids=output_ids,
            tenant=tenant,
            fork_of=fork_of,
            pooling=pooling,
        )
        if error is None:
            self.outputs[request_id] = []
        return error

    def abort(self, request_id: str, keep_output: bool = False) -> None:
        """With `keep_output` the request ends with finish_reason "abort": a running one in the
        next step output, any other at once, as the scheduler actor ends it."""
        seq = self.batcher.abort(request_id, keep_output)
        if keep_output and seq is not None and seq.state is not State.RUNNING:
            self.finish_reasons[request_id] = "abort"

    def step(self) -> StepOutput:
        """One scheduling round: launches the next model step, then books and returns the output
        of the step launched before it (empty on the first; with `overlap=False`, of this one), as
        the two actors would do them."""
        for command in self.batcher.schedule():
            self.batch.apply(command)
        inputs, plan = self.batch.plan_step(self.max_prefill_tokens)
        self.runner.copy_blocks([(c.source, c.target) for c in self.batch.take_copies()])  # no host tier: copies only
        started = time.perf_counter()
        masks = StepMasks.of(inputs, plan, self.in_flight, self.grammars)  # of its constrained draws
        launched = (self.runner.launch(inputs, masks), plan) if inputs else None
        self.launch_s = time.perf_counter() - started if inputs else 0.0
        previous, self.in_flight = (self.in_flight, launched) if self.overlap else (launched, None)
        updates = []
        if previous is not None:
            pending, launched_plan = previous
            tokens = pending.tokens()
            logprobs = pending.logprobs() if self.batch.asks_logprobs(launched_plan) else None
            updates = self.batch.book(launched_plan, tokens, logprobs, pending.pooled())
        updates += self.batch.take_ended()
        self.steps += 1
        output = StepOutput("in-process", self.steps, updates, self.batch.take_dropped())
        self.batcher.on_step(output)
        for update in updates:
            if update.request_id in self.outputs:
                self.outputs[update.request_id] += update.token_ids
            if update.finish_reason:
                self.finish_reasons[update.request_id] = update.finish_reason
            if update.cached_tokens is not None:
                self.cached_tokens.setdefault(update.request_id, update.cached_tokens)
            if update.embedding is not None:
                self.embeddings[update.request_id] = np.frombuffer(update.embedding, "<f4")
        return output

    @property
    def busy(self) -> bool:
        return bool(self.batcher.sequences)

    def run(
        self, before_step: Callable[[int], None] | None = None, min_steps: int = 0, max_steps: int = 100_000
    ) -> None:
        """Steps until every request has finished and `min_steps` have passed; `before_step(i)`
        may submit more requests on the way. A round that launches nothing while requests wait (for
        their grammar's compile in its thread: seconds for a vocabulary of 128K) sleeps a little
        rather than spin through `max_steps`."""
        for i in range(max_steps):
            if before_step:
                before_step(i)
            if i >= min_steps and not self.busy:
                return
            self.step()
            if self.launch_s == 0.0 and self.in_flight is None:
                time.sleep(IDLE_WAIT_S)
        raise RuntimeError(f"requests still running after {max_steps} steps")
