"""The executor actor's way of stepping on a GPU, run on the CPU: a runner that says its launches
return once enqueued is launched on the actor's event loop, and the actor polls each step for its
end there. Steps that report themselves unfinished a few times must still give, over the bus, the
tokens of the in-process engine; a launch that holds the loop too long is logged.
"""

import argparse
import asyncio
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest
import structlog

from actors.executor import step_launcher
from actors.executor.actor import ExecutorActor
from actors.inprocess import InProcessEngine
from actors.scheduler.batching import ContinuousBatcher
from gpu.runner import ModelRunner
from gpu.step_io import PendingStep
from kernel.bus import Bus
from kernel.config import EngineConfig, KernelConfig
from kernel.nats_server import EmbeddedNats
from kernel.subjects import Subjects
from schemas.step import Commands, StepOutput
from tests.sampling import greedy

BLOCKS, BLOCK_SIZE, MAX_PREFILL_TOKENS = 64, 4, 32
UNFINISHED_POLLS = 3  # each step says it is still running this many times before it may say it is done
PROMPTS = [[11, 12, 13, 14, 15], [21, 22, 23], list(range(30, 70)), [71, 72]]  # the third takes two chunks
MAX_TOKENS = [6, 9, 4, 7]


@pytest.fixture
def launched_on_loop(monkeypatch):
    """Makes CPU runners take the GPU way; returns the thread of each launch and the polls of each step."""
    launch_threads, polls = [], Counter()
    monkeypatch.setattr(ModelRunner, "launches_asynchronously", property(lambda self: True))
    launch = ModelRunner.launch

    def recorded_launch(self, seqs, masks=None):
        launch_threads.append(threading.get_ident())
        return launch(self, seqs, masks)

    done = PendingStep.done

    def slow_done(self):
        polls[id(self)] += 1
        return polls[id(self)] > UNFINISHED_POLLS and done(self)

    monkeypatch.setattr(ModelRunner, "launch", recorded_launch)
    monkeypatch.setattr(PendingStep, "done", slow_done)
    return launch_threads, polls


@dataclass
class RoundTrips:
    """What crossed the bus between the executor and the scheduler's stand-in."""

    executor: ExecutorActor | None = None  # its step_count: the step outputs it published
    outputs_answered: int = 0  # by the stand-in, its commands published
    commands_published: int = 0
    commands_received: int = 0  # by the executor

    def settled(self) -> bool:
        """Every step output published so far is answered, and the answers have arrived."""
        published = self.executor.step_count if self.executor else 0
        return self.outputs_answered == published and self.commands_received == self.commands_published


@pytest.fixture
def steps_outlast_the_bus(monkeypatch):
    """Makes CPU runners take the GPU way, and a step end only once the scheduler's answers to every
    step output published so far have reached the executor: a GPU step outlasts the bus's round
    trip, and this one does however slow this machine is."""
    round_trips = RoundTrips()
    monkeypatch.setattr(ModelRunner, "launches_asynchronously", property(lambda self: True))
    on_commands = ExecutorActor._on_commands

    async def counted_on_commands(self, message, reply_to):
        round_trips.commands_received += 1
        await on_commands(self, message, reply_to)

    done = PendingStep.done
    monkeypatch.setattr(ExecutorActor, "_on_commands", counted_on_commands)
    monkeypatch.setattr(PendingStep, "done", lambda self: round_trips.settled() and done(self))
    return round_trips


@pytest.fixture
def captured_logs():
    """The structlog events of the test; entered before the actor binds its logger."""
    with structlog.testing.capture_logs() as logs:
        yield logs


async def serve_through_executor(
    tmp_path, model_dir, prompts: list[list[int]], max_tokens: list[int], round_trips: RoundTrips | None = None
) -> tuple[dict[str, list[int]], list[StepOutput]]:
    """Runs the prompts through a real executor actor over a real bus, with the plain batcher in
    the scheduler's place, counting the bus's traffic in `round_trips` if given; returns each
    request's tokens and the step outputs, in order."""
    nats_server = EmbeddedNats(tmp_path / "nats")
    await nats_server.start()
    executor_bus = await Bus.connect(nats_server.url, "executor")
    scheduler_bus = await Bus.connect(nats_server.url, "test-scheduler")
    config = KernelConfig(
        engine=EngineConfig(
            model=str(model_dir),
            device="cpu",
            num_kv_blocks=BLOCKS,
            block_size=BLOCK_SIZE,
            max_prefill_tokens=MAX_PREFILL_TOKENS,
        )
    )
    executor = ExecutorActor(config, executor_bus, argparse.Namespace())
    subjects = Subjects(config.bus.namespace)
    round_trips = round_trips or RoundTrips()
    round_trips.executor = executor
    outputs, step_outputs, finished = defaultdict(list), [], asyncio.Event()

    async def send(commands: list) -> None:
        round_trips.commands_published += 1
        await scheduler_bus.publish(subjects.executor_commands, Commands("test-scheduler", commands))

    try:
        await executor.start()
        batcher = ContinuousBatcher(
            BLOCKS,
            BLOCK_SIZE,
            executor.max_model_len,
            executor.runner.vocab_size,
            8,
            MAX_PREFILL_TOKENS,
            prefix_caching=False,
        )
        for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
            assert batcher.submit(f"r{i}", prompt, greedy(n), origin="test") is None

        async def on_step(output: StepOutput, _reply_to) -> None:  # what the scheduler actor does with one
            step_outputs.append(output)
            for update in output.updates:
                outputs[update.request_id] += update.token_ids
            batcher.on_step(output)
            commands = batcher.schedule()
            if commands:
                await send(commands)
            round_trips.outputs_answered += 1
            if not batcher.sequences:
                finished.set()

        await scheduler_bus.subscribe(subjects.step_outputs, StepOutput, on_step)
        await send(batcher.schedule())
        await asyncio.wait_for(finished.wait(), 60)
    finally:
        for task in list(executor._tasks):
            task.cancel()
        await asyncio.gather(*executor._tasks, return_exceptions=True)
        await scheduler_bus.close()
        await executor_bus.close()
        await nats_server.stop()
    return dict(outputs), step_outputs


def in_process_outputs(model_dir, prompts: list[list[int]], max_tokens: list[int]) -> dict[str, list[int]]:
    engine = InProcessEngine(
        ModelRunner(model_dir, device="cpu", num_kv_blocks=BLOCKS, block_size=BLOCK_SIZE),
        max_prefill_tokens=MAX_PREFILL_TOKENS,
        prefix_caching=False,
    )
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
        engine.submit(f"r{i}", prompt, greedy(n))
    engine.run()
    return engine.outputs


async def test_steps_launched_and_polled_on_the_loop_give_the_in_process_tokens(
    tmp_path, build_tiny_model, launched_on_loop, captured_logs, monkeypatch
):
    monkeypatch.setattr(step_launcher, "SLOW_LAUNCH_S", 0.0)  # every launch counts as slow: each is logged
    model_dir = build_tiny_model("llama")
    outputs, _ = await serve_through_executor(tmp_path, model_dir, PROMPTS, MAX_TOKENS)

    launch_threads, polls = launched_on_loop
    assert set(launch_threads) == {threading.get_ident()}  # every launch ran on the event loop's thread
    slow = [e for e in captured_logs if e["event"] == "slow_launch" and e["sequences"]]  # the last launch steps nothing
    assert len(slow) == len(launch_threads)
    assert polls and min(polls.values()) > UNFINISHED_POLLS  # each step was polled until it said done

    assert outputs == in_process_outputs(model_dir, PROMPTS, MAX_TOKENS)
    assert [len(outputs[f"r{i}"]) for i in range(len(PROMPTS))] == MAX_TOKENS


async def test_every_step_computes_a_full_prefill_budget_while_prompts_wait(
    tmp_path, build_tiny_model, steps_outlast_the_bus
):
    """The executor plans a step as soon as it publishes the output of the step before last, so the
    scheduler's answer to an output arrives two plans later: the scheduler must send prompt chunks
    that far ahead, and the executor must cut them where a step's budget ends. Then no step
    computes fewer prompt tokens than the budget while prompts wait, nor more."""
    prompts = [list(range(100 * i, 100 * i + 40)) for i in range(4)]  # 160 tokens: five budgets of 32
    max_tokens = [3, 3, 3, 3]
    model_dir = build_tiny_model("llama")
    outputs, step_outputs = await serve_through_executor(
        tmp_path, model_dir, prompts, max_tokens, steps_outlast_the_bus
    )

    prefilled = [sum(u.prefilled_tokens for u in output.updates) for output in step_outputs]
    assert prefilled[:5] == [MAX_PREFILL_TOKENS] * 5 and sum(prefilled) == 160
    assert outputs == in_process_outputs(model_dir, prompts, max_tokens)
