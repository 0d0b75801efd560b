"""What an origin counts for `/metrics`: each request once, at its end or when its client leaves,
its first token's latency once, later deliveries as inter-token latencies, and its tokens as the
client received them, however outputs repeat."""

from actors.lib.origin.request_figures import TTFT_BOUNDS_S, Counts, OriginFigures
from actors.lib.origin.request_stream import RequestRecord, RequestStream
from schemas.errors import Error
from schemas.generate import SamplingParams
from schemas.requests import RequestOutput


async def no_close(_stream) -> None:
    pass


def stream_of(figures: OriginFigures, prompt: list[int], arrived: float = 0.0) -> RequestStream:
    return RequestStream(RequestRecord("r", prompt, SamplingParams()), 60.0, no_close, figures.clock(arrived))


def test_a_histogram_counts_each_value_in_the_first_bucket_whose_bound_holds_it():
    counts = Counts((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 3.0):
        counts.observe(value)
    wire = counts.wire()
    assert wire.counts == [2, 2, 1]  # <= 0.1, <= 1.0, above: a bound holds the value equal to it
    assert wire.sum == 4.65


async def test_a_request_counts_its_latencies_and_tokens_as_its_client_received_them():
    figures = OriginFigures("o")
    stream = stream_of(figures, [1, 2, 3], arrived=100.0)
    clock = stream.clock
    clock.tokens(2, 3, now=100.5)  # what `deliver` calls, here with a known time
    clock.tokens(1, 3, now=100.7)
    clock.tokens(1, 3, now=101.0)
    clock.end("stop", 3, 4, now=101.5)
    clock.end("stop", 3, 4, now=102.0)  # a second end counts nothing
    clock.tokens(1, 3, now=103.0)  # nor tokens after it
    snapshot = figures.snapshot(in_flight=0)
    assert sum(snapshot.time_to_first_token_s.counts) == 1
    assert snapshot.time_to_first_token_s.sum == 0.5
    assert sum(snapshot.inter_token_latency_s.counts) == 2
    assert round(snapshot.inter_token_latency_s.sum, 6) == 0.5
    assert round(snapshot.time_per_output_token_s.sum, 6) == round(1.0 / 3, 6)  # first token to end, per later token
    assert snapshot.e2e_latency_s.sum == 1.5
    assert (snapshot.prompt_tokens_total, snapshot.generation_tokens_total) == (3, 4)
    assert snapshot.finished == {"stop": 1, "length": 0, "abort": 0, "error": 0}
    assert snapshot.time_to_first_token_s.bounds == list(TTFT_BOUNDS_S)


async def test_delivered_outputs_count_once_however_they_repeat():
    figures = OriginFigures("o")
    stream = stream_of(figures, [1, 2])
    stream.deliver(RequestOutput("r", [10, 11], "ab", output_index=0))
    stream.deliver(RequestOutput("r", [11, 12], "bc", output_index=1))  # a repeat from a replaced run: dropped
    stream.deliver(RequestOutput("r", [12], "c", output_index=2))
    stream.deliver(RequestOutput("r", [13], "d", "length", 4, output_index=3))
    stream.deliver(RequestOutput("r", [14], "e", "length", 5, output_index=4))  # past the end
    await stream.close()  # after the end: nothing more
    snapshot = figures.snapshot(in_flight=0)
    assert snapshot.generation_tokens_total == 4 == len(stream.record.delivered_ids)
    assert snapshot.prompt_tokens_total == 2
    assert sum(snapshot.time_to_first_token_s.counts) == 1
    assert sum(snapshot.inter_token_latency_s.counts) == 2
    assert snapshot.finished["length"] == 1 and sum(snapshot.finished.values()) == 1
    assert sum(snapshot.generation_tokens.counts) == 1 and snapshot.generation_tokens.sum == 4


async def test_a_client_that_leaves_counts_an_abort_and_one_that_read_a_failure_an_error():
    figures = OriginFigures("o")
    left = stream_of(figures, [1, 2, 3])
    left.deliver(RequestOutput("r", [10], "a", output_index=0))
    await left.close()  # still running: its client went away
    failed = stream_of(figures, [1, 2, 3])
    failed.fail(Error("timeout", "late"))
    assert [output.finish_reason async for output in failed] == ["error"]
    await failed.close()
    snapshot = figures.snapshot(in_flight=0)
    assert snapshot.finished == {"stop": 0, "length": 0, "abort": 1, "error": 1}
    assert snapshot.prompt_tokens_total == 3  # only the one that computed its prompt (a token came)
    assert sum(snapshot.e2e_latency_s.counts) == 2


async def test_a_prompt_alone_counts_its_tokens_and_a_refused_request_counts_nowhere():
    figures = OriginFigures("o")
    scored = stream_of(figures, [1, 2, 3, 4])  # max_tokens 0: the prompt is computed, nothing is drawn
    scored.deliver(RequestOutput("r", [], "", "length", 0, output_index=0))
    refused = stream_of(figures, [1, 2])
    refused.clock.forget()
    await refused.close()
    snapshot = figures.snapshot(in_flight=0)
    assert snapshot.prompt_tokens_total == 4
    assert sum(snapshot.time_to_first_token_s.counts) == 0
    assert snapshot.finished["length"] == 1 and sum(snapshot.finished.values()) == 1
