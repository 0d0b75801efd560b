"""The `llm.generate` bus API, used by a plain nats-py client."""

import uuid

import msgspec
import pytest

from schemas.errors import Error
from schemas.generate import GenerateChunk, GenerateRequest, GenerateResult, SamplingParams

Reply = GenerateChunk | GenerateResult | Error


@pytest.fixture
async def nc(server):
    connection = await server.connect_nats()
    yield connection
    await connection.drain()


def encode(message) -> bytes:
    return msgspec.msgpack.encode(message)


async def test_generate_returns_the_completion(nc):
    request = GenerateRequest(
        text="Once upon a time", params=SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    )
    reply = msgspec.msgpack.decode((await nc.request("llm.generate", encode(request), timeout=60)).data, type=Reply)
    assert isinstance(reply, GenerateResult)
    assert reply.finish_reason == "length"
    assert reply.completion_tokens == len(reply.token_ids) == 10
    assert reply.prompt_tokens > 0


async def test_streamed_chunks_arrive_in_order_then_the_result(nc):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    whole = msgspec.msgpack.decode(
        (await nc.request("llm.generate", encode(GenerateRequest(text="Hello", params=params)), timeout=60)).data,
        type=Reply,
    )
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish("llm.generate", encode(GenerateRequest(text="Hello", params=params, stream=True)), reply=inbox)
    chunks = []
    while True:
        item = msgspec.msgpack.decode((await sub.next_msg(timeout=60)).data, type=Reply)
        if isinstance(item, GenerateResult):
            break
        assert isinstance(item, GenerateChunk)
        chunks.append(item)
    assert [c.sequence for c in chunks] == list(range(len(chunks)))
    assert [t for c in chunks for t in c.token_ids] == item.token_ids == whole.token_ids
    assert "".join(c.text for c in chunks) == item.text == whole.text


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1 not msgpack",
        msgspec.msgpack.encode({"type": "no-such-tag"}),
        msgspec.msgpack.encode({"type": "generate", "text": 12}),
        msgspec.msgpack.encode({"type": "generate", "text": "hi", "params": {"max_tokens": "ten"}}),
    ],
)
async def test_malformed_messages_get_error_replies(nc, payload):
    reply = msgspec.msgpack.decode((await nc.request("llm.generate", payload, timeout=30)).data, type=Reply)
    assert isinstance(reply, Error)
    assert reply.code == "invalid_request"


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (GenerateRequest(text="hi", n=2, params=SamplingParams(max_tokens=0)), "invalid_request"),
        (GenerateRequest(text="hi", params=SamplingParams(min_p=1.5)), "invalid_request"),  # refused when decoded
        (GenerateRequest(text="hi", params=SamplingParams(max_tokens=10**7)), "context_length_exceeded"),
        (GenerateRequest(messages=[]), "invalid_request"),
        (GenerateRequest(text="hi", input_ids=[1, 2]), "invalid_request"),
        (GenerateRequest(text="hi", model="other"), "not_found"),
    ],
)
async def test_bad_requests_get_error_replies(nc, request_, code):
    reply = msgspec.msgpack.decode((await nc.request("llm.generate", encode(request_), timeout=30)).data, type=Reply)
    assert isinstance(reply, Error)
    assert reply.code == code
    good = GenerateRequest(text="ok", params=SamplingParams(max_tokens=2))
    assert isinstance(
        msgspec.msgpack.decode((await nc.request("llm.generate", encode(good), timeout=60)).data, type=Reply),
        GenerateResult,
    )


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(max_tokens=-1), "params.max_tokens"),
        (SamplingParams(top_logprobs=21), "params.top_logprobs"),
        (SamplingParams(temperature=2.5), "params.temperature"),
        (SamplingParams(top_p=0.0), "params.top_p"),
        (SamplingParams(top_k=-2), "params.top_k"),
        (SamplingParams(seed=2**63), "params.seed"),
        (SamplingParams(stop=["."] * 17), "params.stop"),
        (SamplingParams(stop_token_ids=[2, -1]), "params.stop_token_ids[1]"),
    ],
)
async def test_sampling_out_of_range_is_refused_naming_the_field(nc, params, field):
    """The ranges HTTP refuses (tests/frontdoor/test_openai_protocol.py), refused alike on the bus."""
    request = GenerateRequest(text="hi", params=params)
    reply = msgspec.msgpack.decode((await nc.request("llm.generate", encode(request), timeout=30)).data, type=Reply)
    assert isinstance(reply, Error)
    assert (reply.code, reply.param, reply.retriable) == ("invalid_request", field, False)
    assert f"`$.{field}`" in reply.message


async def test_stop_strings_without_text_are_refused(nc):
    request = GenerateRequest(text="hi", params=SamplingParams(stop=["."], detokenize=False))
    reply = msgspec.msgpack.decode((await nc.request("llm.generate", encode(request), timeout=30)).data, type=Reply)
    assert isinstance(reply, Error)
    assert (reply.code, reply.param) == ("invalid_request", "stop")


async def collect(nc, request: GenerateRequest) -> list:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish("llm.generate", encode(request), reply=inbox)
    replies = []
    while not replies or isinstance(replies[-1], GenerateChunk):
        replies.append(msgspec.msgpack.decode((await sub.next_msg(timeout=60)).data, type=Reply))
    await sub.unsubscribe()
    return replies


async def test_asking_again_replays_a_stream_from_where_the_client_stands(nc):
    """What a client does when a bus outage lost some of its chunks."""
    request = GenerateRequest(
        text="Replay me",
        params=SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
        stream=True,
        request_id=f"replay-{uuid.uuid4().hex}",
    )
    first = await collect(nc, request)
    again = await collect(nc, msgspec.structs.replace(request, resume_from=3))
    assert isinstance(first[-1], GenerateResult) and len(first) > 4
    assert again == first[3:]


async def test_resuming_an_unknown_request_is_a_retriable_error(nc):
    request = GenerateRequest(text="hi", stream=True, request_id="never-sent", resume_from=2)
    reply = msgspec.msgpack.decode((await nc.request("llm.generate", encode(request), timeout=30)).data, type=Reply)
    assert isinstance(reply, Error)
    assert (reply.code, reply.retriable) == ("not_found", True)
