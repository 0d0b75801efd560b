"""A step the device has no memory for, through a real executor actor over a real bus, with the
plain batcher in the scheduler's place: the executor survives, the running sequences are retracted
and recomputed under smaller limits, and every request gets exactly the tokens of a run that never
ran out of memory (nothing repeated, nothing missing). On the CPU and on the GPU's way of stepping
(launches on the event loop). A step that cannot be made smaller raises the error after all, and
an abort between the failure and its report still ends its request."""

import asyncio

import pytest
import torch

from actors.executor.running_batch import RunningBatch
from actors.executor.running_sequence import PlannedInput, RunningSequence
from actors.executor.step_memory import MIN_PREFILL_TOKENS, StepMemory
from gpu.model import DecoderLayer
from schemas.generate import SamplingParams
from schemas.step import DropSequence, PrefillChunk, SequenceUpdate, StartSequence
from tests.actors.test_executor_on_its_loop import (  # noqa: F401 (a fixture)
    MAX_PREFILL_TOKENS,
    in_process_outputs,
    launched_on_loop,
    serve_through_executor,
)

PROMPTS = [list(range(10 + 7 * i, 10 + 7 * i + 3 + (5 * i) % 28)) for i in range(12)]  # 3 to 30 tokens
MAX_TOKENS = [6 + i % 5 for i in range(12)]
MEMORY_TOKENS = MIN_PREFILL_TOKENS  # a step of more tokens runs out of memory


def short_of_memory(monkeypatch) -> list[int]:
    """From now on a step of more than MEMORY_TOKENS tokens runs out of memory in its second layer,
    after the first wrote its KV, as a forward pass that allocates as it goes does; returns the
    sizes of the steps that failed."""
    failed = []
    query = DecoderLayer.query

    def query_short_of_memory(self, x, residual, rope, kv):
        if self.self_attn.layer_index == 1 and x.shape[0] > MEMORY_TOKENS:
            failed.append(x.shape[0])
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate the activations of {x.shape[0]} tokens"
            )
        return query(self, x, residual, rope, kv)

    monkeypatch.setattr(DecoderLayer, "query", query_short_of_memory)
    return failed


async def test_steps_out_of_memory_are_retried_smaller_and_lose_nothing(tmp_path, build_tiny_model, monkeypatch):
    model_dir = build_tiny_model("llama")
    reference = in_process_outputs(model_dir, PROMPTS, MAX_TOKENS)
    failed = short_of_memory(monkeypatch)
    outputs, step_outputs = await serve_through_executor(tmp_path, model_dir, PROMPTS, MAX_TOKENS)

    reports = [output.out_of_memory for output in step_outputs if output.out_of_memory]
    assert failed and len(reports) == len(failed)  # every failure reported, the executor alive throughout
    assert all(r.tokens > MEMORY_TOKENS and r.message.startswith("CUDA out of memory") for r in reports)
    assert outputs == reference  # the stand-in joins every update's tokens: a repeat or a gap would show


@pytest.mark.usefixtures("launched_on_loop")
async def test_the_same_on_the_gpus_way_of_stepping(tmp_path, build_tiny_model, monkeypatch):
    model_dir = build_tiny_model("llama")
    reference = in_process_outputs(model_dir, PROMPTS, MAX_TOKENS)
    failed = short_of_memory(monkeypatch)
    outputs, step_outputs = await serve_through_executor(tmp_path, model_dir, PROMPTS, MAX_TOKENS)
    assert failed and sum(1 for output in step_outputs if output.out_of_memory) == len(failed)
    assert outputs == reference


def planned(prefill_tokens: list[int]) -> list[PlannedInput]:
    """A step's plan with one input of each of these prompt token counts (0: a decode)."""
    return [
        PlannedInput(RunningSequence(f"r{i}", SamplingParams(), [], 0), i, n, 0, False)
        for i, n in enumerate(prefill_tokens)
    ]


async def test_a_step_with_nothing_smaller_to_become_raises():
    memory = StepMemory(MAX_PREFILL_TOKENS, torch.device("cpu"))
    error = torch.OutOfMemoryError("CUDA out of memory")
    report = await memory.recover(error, planned([0, 24]))  # two sequences: the scheduler can run fewer
    assert (report.sequences, report.tokens) == (2, 25)
    assert memory.prefill_budget == max(MIN_PREFILL_TOKENS, 12)
    for plan in ([0], [MIN_PREFILL_TOKENS], []):  # one decode, one chunk at the floor, only block copies
        with pytest.raises(torch.OutOfMemoryError):
            await memory.recover(error, planned(plan))
    assert (await memory.recover(error, planned([MIN_PREFILL_TOKENS + 1]))).sequences == 1


def test_the_executor_halves_its_prompt_budget_only_for_steps_with_prompt_tokens():
    memory = StepMemory(64, torch.device("cpu"))
    asyncio.run(memory.recover(torch.OutOfMemoryError("x"), planned([0, 0, 0])))
    assert memory.prefill_budget == 64  # decodes failed: the scheduler runs fewer, the budget stays
    asyncio.run(memory.recover(torch.OutOfMemoryError("x"), planned([0, 40])))
    assert memory.prefill_budget == 20


def test_a_forgotten_sequence_aborted_before_its_retraction_still_ends_after_its_tokens():
    """The scheduler may abort a request between the failed step and the report of it: the
    executor forgot the sequence, yet the abort's end must come, after the tokens it booked."""
    batch = RunningBatch(block_size=4, max_model_len=64, eos_token_ids=[], vocab_size=1000)
    for request_id in ("a", "b"):
        batch.apply(StartSequence(request_id, SamplingParams(max_tokens=8), [0, 1], 0, 0))
        batch.apply(PrefillChunk(request_id, [5, 6, 7], 0, True))
    _, plan = batch.plan_step(MAX_PREFILL_TOKENS)
    assert [u.token_ids for u in batch.book(plan, [40, 41])] == [[40], [41]]
    batch.forget_all()
    assert len(batch) == 0 and batch.take_dropped() == []  # no drop confirmed: the scheduler sends its own
    batch.apply(DropSequence("a", abort=True))
    batch.apply(DropSequence("b"))
    assert batch.take_ended() == [SequenceUpdate("a", [], 1, finish_reason="abort")]
    assert batch.take_dropped() == ["a", "b"]
    batch.apply(DropSequence("a", abort=True))  # once only: a later drop of the id finds nothing
    assert batch.take_ended() == []
