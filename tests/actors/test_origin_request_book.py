"""The origin's book of requests in flight: each output reaches its own request, and only one that
is still in the book; the book says which requests may still run and which have stalled."""

from actors.lib.origin.request_book import RequestBook
from actors.lib.origin.request_stream import RequestRecord, RequestStream
from schemas.generate import SamplingParams
from schemas.requests import OutputBatch, RequestOutput
from schemas.step import SequenceUpdate, StepOutput


async def no_close(_stream) -> None:
    pass


def stream(request_id: str, detokenize: bool = True) -> RequestStream:
    return RequestStream(RequestRecord(request_id, [1, 2], SamplingParams(detokenize=detokenize)), 60.0, no_close)


async def received(s: RequestStream) -> list[RequestOutput]:
    """What the client has read so far, its end included (the stream must have ended)."""
    return [output async for output in s]


async def test_outputs_reach_their_own_request_while_it_is_in_the_book():
    book = RequestBook()
    a, b, gone = stream("a"), stream("b"), stream("gone")
    for s in (a, b, gone):
        book.open(s)
    book.close("gone")
    book.deliver(
        OutputBatch(
            [
                RequestOutput("a", [10], "x", output_index=0),
                RequestOutput("b", [20], "y", "stop", 1, output_index=0),
                RequestOutput("gone", [30], "z", output_index=0),
                RequestOutput("never-ours", [40], "w", output_index=0),
                RequestOutput("a", [11], "x", "length", 2, output_index=1),
            ]
        )
    )
    assert [(o.token_ids, o.text) for o in await received(a)] == [([10], "x"), ([11], "x")]
    assert [(o.token_ids, o.finish_reason) for o in await received(b)] == [([20], "stop")]
    assert gone.record.delivered_ids == [] and len(book) == 2


async def test_step_outputs_reach_only_the_requests_that_want_no_text():
    """A tokenizer turns the steps of the others into text; taking them here too would double them."""
    book = RequestBook()
    text, ids = stream("text"), stream("ids", detokenize=False)
    book.open(text)
    book.open(ids)
    book.deliver_step(
        StepOutput(
            "executor-1",
            7,
            [
                SequenceUpdate("text", [10], output_index=0),
                SequenceUpdate("ids", [20, 21], output_index=0, finish_reason="length"),
            ],
        )
    )
    assert text.record.delivered_ids == []
    assert [(o.token_ids, o.finish_reason) for o in await received(ids)] == [([20, 21], "length")]


async def test_running_leaves_out_requests_whose_end_has_come():
    book = RequestBook()
    ended, running = stream("ended"), stream("running")
    book.open(ended)
    book.open(running)
    book.deliver(OutputBatch([RequestOutput("ended", [10], "x", "stop", 1, output_index=0)]))
    assert book.running() == [running]  # the end has come, though its client has not read it yet


def test_a_stalled_request_is_timed_anew_once_it_is_found():
    book = RequestBook()
    quiet, busy = stream("quiet"), stream("busy")
    book.open(quiet)
    book.open(busy)
    quiet.progressed_at, busy.progressed_at = 100.0, 104.0
    assert book.stalled(now=106.0, stall_s=5.0) == [quiet]
    assert book.stalled(now=107.0, stall_s=5.0) == []  # it moves now: stalled again only 5 s on
    assert book.stalled(now=111.5, stall_s=5.0) == [quiet, busy]
