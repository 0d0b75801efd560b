"""The scheduler's request table on its own: what a request must pass to join, and where each
request stands as it starts, is preempted, drains, ends, or waits again for a new executor."""

import pytest

from actors.scheduler.request_table import RequestTable
from actors.scheduler.sequence import Sequence, State
from schemas.errors import Error
from schemas.generate import SamplingParams


def add(table: RequestTable, request_id: str, prompt: list[int] = (1, 2, 3), max_tokens: int | None = 4) -> Sequence:
    seq = table.add(request_id, list(prompt), SamplingParams(max_tokens=max_tokens), "origin", [], "", None)
    assert isinstance(seq, Sequence), seq
    return seq


def ids(seqs) -> list[str]:
    return [s.request_id for s in seqs]


def test_a_request_without_max_tokens_gets_what_the_context_leaves():
    table = RequestTable(max_model_len=16, vocab_size=100)
    assert add(table, "r", prompt=[1, 2, 3], max_tokens=None).params.max_tokens == 13
    assert table.get("r").state is State.WAITING and len(table) == 1


@pytest.mark.parametrize(
    ("prompt", "params", "code", "param"),
    [
        ([], SamplingParams(max_tokens=4), "invalid_request", "prompt"),
        ([1, 2, 100], SamplingParams(max_tokens=4), "invalid_request", "prompt"),  # outside the vocabulary
        ([1, 2, 3], SamplingParams(max_tokens=14), "context_length_exceeded", "max_tokens"),
        (
            list(range(16)),
            SamplingParams(max_tokens=None),
            "context_length_exceeded",
            "prompt",
        ),  # no room for one token
        (list(range(16)), SamplingParams(max_tokens=0), "context_length_exceeded", "prompt"),  # nor for a prompt alone
        ([1, 2, 3], SamplingParams(logprob_token_ids=[5, 100]), "invalid_request", "logprob_token_ids"),
        ([1, 2, 3], SamplingParams(prompt_logprobs_from=3), "invalid_request", "prompt_logprobs_from"),
    ],
)
def test_a_request_that_cannot_be_served_is_refused_with_the_field_named(prompt, params, code, param):
    table = RequestTable(max_model_len=16, vocab_size=100)
    error = table.add("r", prompt, params, "origin", [], "", None)
    assert isinstance(error, Error) and (error.code, error.param) == (code, param)
    assert len(table) == 0 and not table.waiting


def test_a_prompt_alone_may_be_scored_from_its_last_position():
    table = RequestTable(max_model_len=16, vocab_size=100)
    seq = table.add("r", list(range(15)), SamplingParams(max_tokens=0, prompt_logprobs_from=14), "origin", [], "", None)
    assert isinstance(seq, Sequence) and seq.max_total_len == 15


def test_an_id_in_flight_is_refused():
    table = RequestTable(max_model_len=16, vocab_size=100)
    add(table, "r")
    error = table.add("r", [1], SamplingParams(max_tokens=1), "origin", [], "", None)
    assert isinstance(error, Error) and error.code == "invalid_request"


def test_each_request_stands_in_one_place_and_drained_ones_wait_in_arrival_order():
    table = RequestTable(max_model_len=64, vocab_size=100)
    a, b, c, d = (add(table, name) for name in "abcd")
    table.start(a)
    table.start(b)
    assert (ids(table.running), ids(table.waiting)) == (["a", "b"], ["c", "d"])
    table.drain(b)
    assert b.state is State.DRAINING and ids(table.running) == ["a"] and ids(table.waiting) == ["c", "d"]
    table.drained("b")
    assert b.state is State.WAITING and ids(table.waiting) == ["b", "c", "d"]  # before later arrivals
    table.drained("a")  # running, not draining: a confirmation of an older drop changes nothing
    assert a.state is State.RUNNING
    table.remove(a)
    table.remove(c)
    assert (ids(table.running), ids(table.waiting), sorted(table.by_id)) == ([], ["b", "d"], ["b", "d"])


def test_a_new_executor_puts_every_request_back_in_the_queue():
    table = RequestTable(max_model_len=64, vocab_size=100)
    a, b, c = (add(table, name) for name in "abc")
    table.start(a)
    table.start(b)
    table.drain(b)
    assert table.requeue_all(max_model_len=32, vocab_size=50) == [a, b]  # those whose KV is gone
    assert ids(table.waiting) == ["a", "b", "c"] and not table.running
    assert all(s.state is State.WAITING for s in (a, b, c))
    assert (table.max_model_len, table.vocab_size) == (32, 50)
