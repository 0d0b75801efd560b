"""The origin's record takes a request's tokens straight from step outputs (`detokenize` false):
each token once, in order, however runs upstream repeat or overtake it."""

from actors.lib.origin.request_stream import RequestRecord, RequestStream
from schemas.generate import SamplingParams
from schemas.requests import RequestOutput
from schemas.step import SequenceUpdate


async def no_close(_stream) -> None:
    pass


async def test_steps_become_outputs_that_continue_where_the_client_stands():
    stream = RequestStream(RequestRecord("r", [1, 2], SamplingParams(detokenize=False)), 60.0, no_close)
    stream.deliver_step(SequenceUpdate("r", [], cached_tokens=2))  # a run starts: no token yet
    stream.deliver_step(SequenceUpdate("r", [10, 11], output_index=0))
    # A run restarted upstream repeats a token the client has; one that skipped ahead is not next.
    stream.deliver_step(SequenceUpdate("r", [11, 12, 13], output_index=1, cached_tokens=3))
    stream.deliver_step(SequenceUpdate("r", [20], output_index=6))
    stream.deliver_step(SequenceUpdate("r", [14], output_index=4, finish_reason="length"))
    got = [output async for output in stream]  # up to the finish
    assert [(o.token_ids, o.output_index, o.completion_tokens, o.finish_reason) for o in got] == [
        ([10, 11], 0, 2, None),
        ([12, 13], 2, 4, None),
        ([14], 4, 5, "length"),
    ]
    assert all(o.text == "" for o in got)
    assert stream.record.delivered_ids == [10, 11, 12, 13, 14]
    assert stream.cached_tokens == 3  # as the latest run found the cache


async def test_nothing_is_taken_after_the_end_even_before_the_client_reads_it():
    """A run resubmitted while the end waits to be read (a migration) goes on past it: its tokens
    are not the request's, and the request no longer runs, so it is not migrated or aborted."""
    stream = RequestStream(RequestRecord("r", [1, 2], SamplingParams(detokenize=False)), 60.0, no_close)
    stream.deliver_step(SequenceUpdate("r", [10], output_index=0))
    stream.deliver_step(SequenceUpdate("r", [11], output_index=1, finish_reason="stop"))
    assert not stream.running
    stream.deliver_step(SequenceUpdate("r", [], cached_tokens=4))
    stream.deliver_step(SequenceUpdate("r", [12], output_index=2))
    stream.deliver(RequestOutput("r", [12], "x", output_index=2))
    assert [output.token_ids async for output in stream] == [[10], [11]]
    assert stream.record.delivered_ids == [10, 11] and stream.cached_tokens == 0


async def test_version_spans_mark_the_first_token_of_each_weight_version():
    """An in-place update between two steps: the spans start where the new weights' tokens start,
    each token counted once however the outputs repeat; the request's version is its last token's."""
    stream = RequestStream(RequestRecord("r", [1, 2], SamplingParams()), 60.0, no_close)
    stream.deliver(RequestOutput("r", [10, 11], "ab", output_index=0))
    stream.deliver(RequestOutput("r", [11, 12], "bc", output_index=1, weight_version="2"))  # a repeat: dropped
    stream.deliver(RequestOutput("r", [12], "c", output_index=2, weight_version="2"))
    stream.deliver(RequestOutput("r", [], "", output_index=3, weight_version="2"))  # text held back: no token
    stream.deliver(RequestOutput("r", [13], "d", "length", output_index=3, weight_version="2"))
    record = stream.record
    assert record.version_spans == [(0, "default"), (2, "2")]
    assert record.weight_version == "2"
    # A reader that holds only the first two tokens sees the weights of those alone.
    assert record.version_spans_of(2) == [(0, "default")]
    assert record.version_spans_of(4) == record.version_spans


async def test_a_request_that_drew_nothing_has_the_version_its_end_came_with():
    stream = RequestStream(RequestRecord("r", [1, 2], SamplingParams(detokenize=False)), 60.0, no_close)
    stream.deliver_step(SequenceUpdate("r", [], 0, finish_reason="abort"), "3")
    assert stream.record.version_spans == [] and stream.record.weight_version == "3"
