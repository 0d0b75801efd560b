"""Pausing generation on the plain scheduler and executor objects with a real tiny model, each
mode: "abort" ends what is in flight with its output, "retract" sends the running back to the
queue, "in_place" holds the executor's stepping with the KV kept, "wait" lets the running finish.
In every mode nothing is admitted while paused, and after the continue every request completes
with the tokens an unpaused run draws (greedy), the aborted ones with a prefix of them."""

import pytest

from actors.inprocess import InProcessEngine
from actors.scheduler.admin import scheduler_stats
from actors.scheduler.pause import GenerationPause
from actors.scheduler.sequence import State
from gpu.runner import ModelRunner
from schemas.errors import Error
from tests.actors.test_continuous_batching import check_all_freed, check_blocks
from tests.sampling import greedy

PROMPTS = {"a": list(range(5, 25)), "b": list(range(30, 40)), "c": list(range(50, 57))}
LATE = list(range(60, 70))  # submitted while paused


@pytest.fixture(scope="module")
def llama_dir(build_tiny_model):
    return build_tiny_model("llama")


def engine_of(llama_dir) -> InProcessEngine:
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=64, block_size=4)
    return InProcessEngine(runner, max_num_seqs=2, max_prefill_tokens=16)


@pytest.fixture(scope="module")
def unpaused(llama_dir) -> dict[str, list[int]]:
    engine = engine_of(llama_dir)
    for name, prompt in PROMPTS.items():
        engine.submit(name, prompt, greedy(24))
    engine.submit("late", LATE, greedy(24))
    engine.run()
    return engine.outputs


def started(llama_dir) -> InProcessEngine:
    """Three requests, two running (max_num_seqs 2) with a few tokens each, one waiting."""
    engine = engine_of(llama_dir)
    for name, prompt in PROMPTS.items():
        engine.submit(name, prompt, greedy(24))
    while min(len(engine.outputs["a"]), len(engine.outputs["b"])) < 4:
        engine.step()
    assert engine.batcher.sequences["c"].state is State.WAITING
    return engine


def pause(engine: InProcessEngine, pause_: GenerationPause, mode: str) -> None:
    for seq in pause_.pause(engine.batcher, mode):
        if seq.state is not State.RUNNING:  # the scheduler actor ends these itself
            engine.finish_reasons[seq.request_id] = "abort"
    engine.submit("late", LATE, greedy(24))


def resume_and_finish(engine: InProcessEngine, pause_: GenerationPause, unpaused) -> None:
    assert pause_.resume(engine.batcher) is None
    assert not pause_.state(engine.batcher).paused
    engine.run()
    for name, tokens in engine.outputs.items():
        if engine.finish_reasons[name] == "abort":
            assert tokens == unpaused[name][: len(tokens)]
        else:
            assert (tokens, engine.finish_reasons[name]) == (unpaused[name], "length"), name
    check_all_freed(engine)


def test_abort_ends_what_is_in_flight_with_its_output_and_holds_arrivals(llama_dir, unpaused):
    engine, pause_ = started(llama_dir), GenerationPause()
    pause(engine, pause_, "abort")
    for _ in range(4):
        engine.step()
    assert engine.finish_reasons == {"a": "abort", "b": "abort", "c": "abort"}
    assert len(engine.outputs["a"]) >= 4 and engine.outputs["c"] == []
    assert engine.batcher.sequences["late"].state is State.WAITING  # held, not refused
    state = pause_.state(engine.batcher)
    assert (state.paused, state.mode, state.aborted, state.held) == (True, "abort", 3, 1)
    resume_and_finish(engine, pause_, unpaused)


def test_retract_frees_the_kv_and_resumes_with_no_token_lost_or_repeated(llama_dir, unpaused):
    engine, pause_ = started(llama_dir), GenerationPause()
    pause(engine, pause_, "retract")
    for _ in range(4):
        engine.step()
    drawn = {name: len(engine.outputs[name]) for name in PROMPTS}
    assert not engine.batcher.requests.running and len(engine.batcher.requests.waiting) == 4
    assert engine.batcher.kv.pool.num_free + engine.batcher.kv.cache.stats().evictable_blocks == 64
    engine.step()
    assert {name: len(engine.outputs[name]) for name in PROMPTS} == drawn  # nothing runs while paused
    assert engine.batcher.preemptions == 0  # a pause's retraction is no preemption
    resume_and_finish(engine, pause_, unpaused)


def test_in_place_holds_stepping_and_keeps_the_kv(llama_dir, unpaused):
    engine, pause_ = started(llama_dir), GenerationPause()
    pause(engine, pause_, "in_place")
    engine.step()  # books the step in flight, launches none
    drawn = {name: len(engine.outputs[name]) for name in PROMPTS}
    blocks = {name: list(engine.batcher.sequences[name].blocks) for name in ("a", "b")}
    for _ in range(3):
        assert engine.step().updates == []
    assert engine.batch.held and {name: len(engine.outputs[name]) for name in PROMPTS} == drawn
    for name, held in blocks.items():  # kept (a grant ahead may add some)
        assert list(engine.batcher.sequences[name].blocks)[: len(held)] == held
    stats = pause_.stats(scheduler_stats(engine.batcher))
    assert (stats.running, stats.waiting) == (0, 4)  # held ones do not count as running
    check_blocks(engine)
    resume_and_finish(engine, pause_, unpaused)
    assert not engine.batch.held


def test_wait_lets_the_running_finish_and_admits_nothing(llama_dir, unpaused):
    engine, pause_ = started(llama_dir), GenerationPause()
    pause(engine, pause_, "wait")
    for _ in range(60):
        engine.step()
    assert engine.finish_reasons == {"a": "length", "b": "length"}
    assert [s.request_id for s in engine.batcher.requests.waiting] == ["c", "late"]
    assert pause_.state(engine.batcher).held == 2
    resume_and_finish(engine, pause_, unpaused)


def test_a_second_pause_applies_its_mode_and_continue_needs_a_pause(llama_dir, unpaused):
    engine, pause_ = started(llama_dir), GenerationPause()
    assert isinstance(pause_.resume(engine.batcher), Error)
    pause(engine, pause_, "in_place")
    engine.step()
    pause_.pause(engine.batcher, "retract")  # SGLang's: the new mode acts on what is in flight
    engine.step()
    engine.step()
    assert not engine.batch.held and not engine.batcher.requests.running
    assert pause_.state(engine.batcher).mode == "retract"
    resume_and_finish(engine, pause_, unpaused)
    assert isinstance(pause_.resume(engine.batcher), Error)
