"""A client of the `<ns>.generate` bus API, as another service would write it with plain nats-py,
that survives a nats-server restart: it numbers what it has, and when chunks go missing or the
stream falls silent it sends the request again with `resume_from`, so the gateway replays the rest.

    nc = await connect(url, ".kernel/bus/client.json")  # with --api-keys: .kernel/bus/tenants/<tenant>.json
    async for reply in stream_generate(nc, GenerateRequest(text="Hi", params=SamplingParams(seed=1))):
        ...  # GenerateChunk, GenerateChunk, ..., then one GenerateResult per choice

With API keys, a tenant sends on its own subject: `stream_generate(nc, request, subject="llm.generate.<tenant>")`.
"""

import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import nats.errors

from schemas.errors import Error
from schemas.generate import GenerateChunk, GenerateRequest, GenerateResult

Reply = GenerateChunk | GenerateResult | Error


async def connect(url: str, credentials_file: str | Path, **options) -> nats.NATS:
    """Connects as the user of a credential file the supervisor wrote, with replies at the inbox
    prefix the file names: the only inboxes that user may read, so no other client reads its replies."""
    credentials = json.loads(Path(credentials_file).read_text())
    return await nats.connect(
        url,
        user=credentials["user"],
        password=credentials["password"],
        inbox_prefix=credentials["inbox_prefix"],
        **options,
    )


class GenerateFailed(Exception):
    def __init__(self, error: Error) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error


async def stream_generate(
    nc, request: GenerateRequest, subject: str = "llm.generate", silence_s: float = 2.0, timeout_s: float = 300.0
) -> AsyncIterator[GenerateChunk | GenerateResult]:
    """Yields each chunk once, in order, then a result per choice (`request.n` of them); raises
    `GenerateFailed` on an `Error` and `TimeoutError` if the whole request takes longer than `timeout_s`."""
    request = msgspec.structs.replace(request, stream=True, request_id=request.request_id or uuid.uuid4().hex)
    inbox = nc.new_inbox()
    subscription = await nc.subscribe(inbox)
    deadline = time.monotonic() + timeout_s
    received_tokens: Counter[int] = Counter()  # per choice
    results: set[int] = set()  # the choices whose result arrived
    expected = 0  # the sequence number of the next chunk
    asked_for = -1  # the last resume point asked for on a gap: later chunks of the gap need no new ask

    async def ask(resume_from: int) -> None:
        nonlocal asked_for
        asked_for = resume_from
        await nc.publish(
            subject, msgspec.msgpack.encode(msgspec.structs.replace(request, resume_from=resume_from)), reply=inbox
        )

    try:
        await ask(0)
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"request {request.request_id} took longer than {timeout_s} s")
            try:
                message = await subscription.next_msg(timeout=silence_s)
            except nats.errors.TimeoutError:
                await ask(expected)  # silence: maybe replies were lost; asking again is harmless
                continue
            try:
                reply = msgspec.msgpack.decode(message.data, type=Reply)
            except msgspec.DecodeError:
                continue  # not ours to read (a no-responders notice while the gateway restarts)
            match reply:
                case Error():
                    raise GenerateFailed(reply)
                case GenerateChunk(sequence=sequence) if sequence == expected:
                    expected += 1
                    received_tokens[reply.index] += len(reply.token_ids)
                    yield reply
                case GenerateChunk(sequence=sequence) if sequence > expected:
                    if asked_for != expected:
                        await ask(expected)  # a gap: the replay starts at the first missing chunk
                case GenerateResult() if received_tokens[reply.index] < len(reply.token_ids):
                    if asked_for != expected:
                        await ask(expected)  # the last chunks were lost, the result was not
                case GenerateResult() if reply.index not in results:
                    results.add(reply.index)
                    yield reply
                    if len(results) == request.n:
                        return
    finally:
        try:
            await subscription.unsubscribe()
        except nats.errors.Error:
            pass  # the connection is already closed
