"""A request without text needs the origin's subscription to the step outputs: when the bus cannot
take it, the client gets a retriable error and the origin keeps nothing of the request."""

from actors.lib.origin.pipeline import RequestPipeline
from kernel.bus import BusUnavailable
from kernel.subjects import Subjects
from schemas.errors import Error
from schemas.generate import GenerateRequest, SamplingParams


class DisconnectedBus:
    """Refuses subscriptions as `Bus` does while its connection is down; records what is published."""

    def __init__(self) -> None:
        self.published = []

    async def subscribe(self, subject, *_args, **_kwargs):
        raise BusUnavailable(f"the server did not confirm the subscription to {subject}")

    async def publish(self, subject, message) -> None:
        self.published.append((subject, message))

    async def request(self, subject, *_args, **_kwargs):
        raise AssertionError(f"nothing may be sent to {subject} before the step outputs can arrive")


async def test_a_request_without_text_fails_retriably_when_the_bus_cannot_subscribe():
    bus = DisconnectedBus()
    pipeline = RequestPipeline(bus, Subjects(), "origin-1", request_timeout_s=60.0, max_migrations=3)
    request = GenerateRequest(input_ids=[5, 6, 7], params=SamplingParams(detokenize=False))
    reply = await pipeline.submit(request)
    assert isinstance(reply, Error) and reply.code == "unavailable" and reply.retriable
    assert pipeline.streams == {}  # released, so it neither counts against the limit nor migrates
