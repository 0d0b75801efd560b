"""A prompt computed once however its sharers arrive: a running request's computed prompt is in the
prefix cache as soon as its prefill ends, and requests that arrive together with one prefix wait
for the first of them to compute it instead of each computing it again."""

import pytest

from actors.inprocess import InProcessEngine
from gpu.runner import ModelRunner
from schemas.requests import Tenant
from tests.sampling import greedy

BLOCK_SIZE = 4
SYSTEM = list(range(100, 140))  # ten blocks


@pytest.fixture(scope="module")
def runner(build_tiny_model):
    return ModelRunner(build_tiny_model("llama"), device="cpu", num_kv_blocks=96, block_size=BLOCK_SIZE)


def counting_prompt_tokens(runner: ModelRunner) -> list[int]:
    """Wraps runner.launch (undone by the caller) to count the prompt tokens each step feeds."""
    launched, fed = runner.launch, []

    def launch(seqs, masks=None):
        fed.append(sum(len(s.token_ids) for s in seqs if len(s.token_ids) > 1))
        return launched(seqs, masks)

    runner.launch = launch
    return fed


def test_a_running_request_shares_its_prompt_once_prefilled(runner):
    engine = InProcessEngine(runner, max_prefill_tokens=64)
    engine.submit("first", SYSTEM + [1, 2, 3], greedy(40))
    while not engine.outputs["first"]:
        engine.step()
    engine.submit("second", SYSTEM + [4, 5, 6], greedy(4))
    engine.run()
    assert len(engine.outputs["first"]) == 40  # it ran all along
    assert engine.cached_tokens["second"] == len(SYSTEM)


def test_requests_sent_together_compute_their_shared_prompt_once(runner):
    engine = InProcessEngine(runner, max_prefill_tokens=64)
    fed = counting_prompt_tokens(runner)
    try:
        for i in range(4):
            engine.submit(f"r{i}", SYSTEM + [i + 1, i + 2, i + 3], greedy(3))
        engine.run()
    finally:
        del runner.launch
    assert [engine.cached_tokens[f"r{i}"] for i in range(4)] == [0] + [len(SYSTEM)] * 3
    assert sum(fed) == len(SYSTEM) + 4 * 3  # not 4 * 43

    alone = InProcessEngine(runner, max_prefill_tokens=64, prefix_caching=False)
    for i in range(4):
        alone.submit(f"r{i}", SYSTEM + [i + 1, i + 2, i + 3], greedy(3))
    alone.run()
    assert alone.outputs == engine.outputs


def test_other_tenants_do_not_wait_for_a_prefill_they_could_not_read(runner):
    engine = InProcessEngine(runner, max_prefill_tokens=64)
    engine.submit("a", SYSTEM + [1], greedy(2), tenant=Tenant("tenant-a"))
    engine.submit("b", SYSTEM + [2], greedy(2), tenant=Tenant("tenant-b"))
    engine.step()  # both admitted in the first round: b reads none of a's blocks
    assert {s.request_id for s in engine.batcher.requests.running} == {"a", "b"}
    engine.run()
    assert engine.cached_tokens["b"] == 0


def test_a_request_waiting_for_blocks_is_one_lookup_in_the_hit_figures(build_tiny_model):
    runner = ModelRunner(build_tiny_model("llama"), device="cpu", num_kv_blocks=12, block_size=BLOCK_SIZE)
    engine = InProcessEngine(runner, max_prefill_tokens=64)
    engine.submit("big", SYSTEM + [1, 2, 3], greedy(2))
    engine.submit("waits", list(range(300, 330)), greedy(2))  # no room until big ends
    steps = 0
    while "waits" not in engine.cached_tokens:
        engine.step()
        steps += 1
    engine.run()
    assert steps > 2  # it was looked at in several scheduling rounds
    assert engine.batcher.kv.cache.stats().queried_tokens == len(SYSTEM) + 3 + 30
