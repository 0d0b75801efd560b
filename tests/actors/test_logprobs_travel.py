"""Logprobs on their way to a client, on the plain objects: cut to the tokens a client gets, joined
into one run per request with each position once, and kept by the origin's record whatever runs
upstream repeat (a recomputed prompt scores its positions again)."""

from actors.lib.logprobs import LogprobsRun, slice_logprobs, token_ids_of
from actors.lib.origin.request_stream import RequestRecord, RequestStream
from schemas.generate import SamplingParams, TokenLogprobs
from schemas.requests import RequestOutput
from schemas.step import SequenceUpdate
from tests.actors.test_request_stream import no_close


def entries(start: int, count: int, top: bool = True) -> TokenLogprobs:
    """Logprobs of `count` positions from `start`, each telling its position (-position)."""
    positions = range(start, start + count)
    if not top:
        return TokenLogprobs(start, [-float(p) for p in positions])
    return TokenLogprobs(start, [-float(p) for p in positions], [[p, p + 1] for p in positions], [[-0.5, -1.5]] * count)


def test_a_slice_keeps_its_positions_and_the_lists_that_were_asked():
    assert slice_logprobs(entries(10, 5), 1, 3) == TokenLogprobs(
        11, [-11.0, -12.0], [[11, 12], [12, 13]], [[-0.5, -1.5]] * 2
    )
    assert slice_logprobs(entries(0, 3, top=False), 2, 9) == TokenLogprobs(2, [-2.0])
    assert slice_logprobs(entries(0, 3), 3, 4) is None and slice_logprobs(None, 0, 1) is None
    assert token_ids_of(entries(4, 2)) == {4, 5, 6} and token_ids_of(None) == set()


def test_a_run_holds_each_position_once_and_nothing_past_a_gap():
    run = LogprobsRun()
    assert run.whole() is None and run.end is None
    assert run.extend(entries(3, 2)) == entries(3, 2)
    assert run.extend(entries(3, 4)) == entries(5, 2)  # positions 3 and 4 again: only 5 and 6 are new
    assert run.extend(entries(4, 2)) is None
    assert run.extend(entries(9, 1)) is None  # 7 and 8 never came
    assert run.whole() == entries(3, 4) and run.end == 7


def stream(params: SamplingParams) -> RequestStream:
    return RequestStream(RequestRecord("r", [1, 2, 3, 4], params), 60.0, no_close)


async def test_the_record_keeps_the_logprobs_delivered_and_the_prompts_once():
    s = stream(SamplingParams(logprobs=True, prompt_logprobs_from=1))
    s.deliver(RequestOutput("r", [], "", prompt_logprobs=entries(1, 2)))
    s.deliver(RequestOutput("r", [], "", prompt_logprobs=entries(1, 2)))  # a recomputed prompt: nothing new
    s.deliver(RequestOutput("r", [7], "x", prompt_logprobs=entries(1, 3), logprobs=entries(0, 1), output_index=0))
    s.deliver(RequestOutput("r", [8], "y", "stop", 2, output_index=1, logprobs=entries(1, 1), matched_stop="z"))
    got = [o async for o in s]
    assert [(o.token_ids, o.prompt_logprobs) for o in got] == [([], entries(1, 2)), ([7], entries(3, 1)), ([8], None)]
    record = s.record
    assert record.prompt_logprobs.whole() == entries(1, 3) and record.logprobs.whole() == entries(0, 2)
    assert (record.matched_stop, s.finish_reason, s.ended.is_set()) == ("z", "stop", True)


async def test_steps_carry_the_logprobs_of_the_tokens_the_client_gets():
    s = stream(SamplingParams(detokenize=False, logprobs=True, prompt_logprobs_from=0))
    s.deliver_step(SequenceUpdate("r", [], prefilled_tokens=2, prompt_logprobs=entries(1, 1)))
    s.deliver_step(SequenceUpdate("r", [10, 11], 0, 2, logprobs=entries(0, 2), prompt_logprobs=entries(2, 2)))
    s.deliver_step(SequenceUpdate("r", [11, 12], 1, logprobs=entries(1, 2)))  # a repeat, then one new
    s.deliver_step(SequenceUpdate("r", [2], 3, finish_reason="stop", logprobs=entries(3, 1)))
    got = [o async for o in s]
    assert [(o.token_ids, o.logprobs and o.logprobs.start) for o in got] == [
        ([], None),
        ([10, 11], 0),
        ([12], 2),
        ([2], 3),
    ]
    assert got[-1].matched_stop == 2  # the stop token the executor ended on
    assert s.record.logprobs.whole() == entries(0, 4) and s.record.prompt_logprobs.whole() == entries(1, 3)


async def test_a_prompt_computed_alone_ends_with_its_logprobs():
    s = stream(SamplingParams(detokenize=False, max_tokens=0, prompt_logprobs_from=2))
    s.deliver_step(SequenceUpdate("r", [], 0, 4, "length", prompt_logprobs=entries(2, 2)))
    [end] = [o async for o in s]
    assert (end.token_ids, end.finish_reason, end.prompt_logprobs) == ([], "length", entries(2, 2))


async def test_an_abort_ends_where_the_client_stands():
    """Its end may come from the scheduler before the tokens it follows have come through a
    tokenizer (then it waits for them), or behind the client (then it ends where the client is);
    with no end from downstream the origin ends it itself."""
    early = stream(SamplingParams())
    early.deliver(RequestOutput("r", [], "", "abort", 2, output_index=2))
    assert early.running
    early.deliver(RequestOutput("r", [5, 6], "ab", output_index=0))
    assert [(o.token_ids, o.finish_reason, o.output_index) async for o in early] == [
        ([5, 6], None, 0),
        ([], "abort", 2),
    ]

    behind = stream(SamplingParams())
    behind.deliver(RequestOutput("r", [5, 6], "ab", output_index=0))
    behind.deliver(RequestOutput("r", [], "", "length", 1, output_index=1))  # not an abort: a stale repeat
    behind.deliver(RequestOutput("r", [], "", "abort", 1, output_index=1))
    assert [(o.finish_reason, o.output_index, o.completion_tokens) async for o in behind][-1] == ("abort", 2, 2)

    alone = stream(SamplingParams())
    alone.deliver(RequestOutput("r", [5], "a", output_index=0))
    alone.end_aborted()
    alone.end_aborted()
    assert [(o.token_ids, o.finish_reason) async for o in alone] == [([5], None), ([], "abort")]
