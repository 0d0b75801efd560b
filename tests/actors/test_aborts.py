"""Aborts that keep the output, on the plain scheduler and executor objects with a real tiny
model: a running request ends in the executor's next step output with finish_reason "abort" after
every token it published, a waiting one at once; `abort_all` takes one tenant's requests or
everyone's; blocks are freed either way, and the others run on untouched."""

import pytest

from actors.inprocess import InProcessEngine
from actors.scheduler.sequence import State
from gpu.runner import ModelRunner
from schemas.requests import Tenant
from tests.actors.test_continuous_batching import check_all_freed, check_blocks
from tests.sampling import greedy


@pytest.fixture(scope="module")
def llama_dir(build_tiny_model):
    return build_tiny_model("llama")


@pytest.fixture
def engine(llama_dir) -> InProcessEngine:
    runner = ModelRunner(llama_dir, device="cpu", num_kv_blocks=64, block_size=4)
    return InProcessEngine(runner, max_num_seqs=2, max_prefill_tokens=16)


def ends(engine: InProcessEngine, steps: int) -> list:
    return [u for _ in range(steps) for u in engine.step().updates if u.finish_reason]


def test_a_running_request_ends_after_its_last_published_token(engine, llama_dir):
    engine.submit("long", list(range(5, 25)), greedy(40))
    engine.submit("other", list(range(30, 40)), greedy(12))
    while len(engine.outputs["long"]) < 5:
        engine.step()
    engine.abort("long", keep_output=True)
    assert engine.batcher.sequences.get("long") is None
    check_blocks(engine)
    (end,) = [u for u in ends(engine, 3) if u.request_id == "long"]
    assert (end.token_ids, end.finish_reason) == ([], "abort")
    assert end.output_index == len(engine.outputs["long"]) >= 5  # every token it drew, nothing after
    engine.run()
    assert engine.finish_reasons == {"long": "abort", "other": "length"}
    assert len(engine.outputs["other"]) == 12
    check_all_freed(engine)


def test_a_waiting_request_ends_at_once_and_a_plain_abort_ends_nothing(engine):
    for name in ("a", "b", "waits", "dropped"):
        engine.submit(name, list(range(5, 15)), greedy(20))
    engine.step()
    assert engine.batcher.sequences["waits"].state is State.WAITING  # two run at a time
    engine.abort("waits", keep_output=True)
    engine.abort("dropped")
    assert engine.finish_reasons == {"waits": "abort"}
    engine.abort("a")  # running, client gone: no end for anyone
    engine.run()
    assert engine.finish_reasons == {"waits": "abort", "b": "length"}
    check_all_freed(engine)


def test_abort_all_takes_one_tenants_requests_or_everyones(engine):
    tenants = {"a1": Tenant("a"), "a2": Tenant("a", "u"), "b1": Tenant("b"), "b2": Tenant("b")}
    for name, tenant in tenants.items():
        engine.submit(name, list(range(5, 15)), greedy(30), tenant=tenant)
    for _ in range(3):
        engine.step()
    aborted = engine.batcher.abort_all(Tenant("a", "u"))  # a user narrows its tenant
    assert [s.request_id for s in aborted] == ["a2"]
    assert sorted(s.request_id for s in engine.batcher.abort_all(Tenant("a"))) == ["a1"]
    assert sorted(s.request_id for s in engine.batcher.abort_all(None)) == ["b1", "b2"]
    assert not engine.batcher.sequences
    engine.run(min_steps=3)
    assert set(engine.finish_reasons.values()) == {"abort"}
    check_all_freed(engine)
