"""The prefill planner on its own: the round's budget of prompt tokens, the chunks that spend it,
and which waiting requests wait for a running prefill they will read from the cache."""

from actors.scheduler.cache_tenancy import TenancyPolicy
from actors.scheduler.kv_manager import KVManager
from actors.scheduler.prefill_planner import PREFILL_STEPS_AHEAD, PrefillPlanner
from actors.scheduler.sequence import Sequence, State
from schemas.generate import SamplingParams
from schemas.requests import Tenant
from schemas.step import PrefillChunk

SYSTEM = list(range(100, 112))  # three blocks of 4


def running(name: str, prompt: list[int], tenant: Tenant = Tenant(), fork_of: str | None = None) -> Sequence:
    seq = Sequence(name, list(prompt), SamplingParams(max_tokens=4), "origin", 0, tenant=tenant, fork_of=fork_of)
    seq.state = State.RUNNING
    seq.start_run(0)
    return seq


def test_chunks_cover_the_prompt_in_order_within_the_budget():
    planner, seq = PrefillPlanner(max_prefill_tokens=4), running("r", list(range(10)))
    assert planner.budget([seq]) == PREFILL_STEPS_AHEAD * 4
    assert planner.next_chunk(seq, 4) == PrefillChunk("r", [0, 1, 2, 3], 0, last=False)
    assert planner.budget([seq]) == PREFILL_STEPS_AHEAD * 4 - 4  # sent, not yet computed
    seq.prefill_done = 4
    assert planner.budget([seq]) == PREFILL_STEPS_AHEAD * 4
    assert planner.next_chunk(seq, 100) == PrefillChunk("r", [4, 5, 6, 7, 8, 9], 4, last=True)
    assert seq.prefill_sent == 10


def test_a_request_waits_for_a_running_prefill_of_its_tenant_that_it_will_read():
    planner, kv = PrefillPlanner(64), KVManager(32, 4, True, TenancyPolicy())
    first = running("first", SYSTEM + [1, 2])
    same = running("same", SYSTEM + [3, 4])
    assert planner.awaits_shared_prefill(same, [first], kv)
    assert not planner.awaits_shared_prefill(running("other", SYSTEM + [3], tenant=Tenant("b")), [first], kv)
    assert not planner.awaits_shared_prefill(running("choice", SYSTEM + [1, 2], fork_of="first"), [first], kv)
    assert not planner.awaits_shared_prefill(running("unrelated", [7] * 14), [first], kv)
    first.prefill_done = len(first.prefill_ids)  # its prefill is done: nothing to wait for
    assert not planner.awaits_shared_prefill(same, [first], kv)


def test_without_a_cache_nobody_waits():
    planner, kv = PrefillPlanner(64), KVManager(32, 4, False, TenancyPolicy())
    assert not planner.awaits_shared_prefill(running("same", SYSTEM + [3]), [running("first", SYSTEM + [1])], kv)
