"""A request without text needs the origin's subscription to the step outputs: when the bus cannot
take it, the client gets a retriable error and the origin keeps nothing of the request. Over a real
nats-server, whose connection the origin has closed (as it does when its actor stops)."""

from actors.lib.origin.pipeline import RequestPipeline
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.errors import Error
from schemas.generate import GenerateRequest, SamplingParams


async def test_a_request_without_text_fails_retriably_when_the_bus_cannot_subscribe(nats_url):
    bus = await Bus.connect(nats_url, "origin")
    pipeline = RequestPipeline(bus, Subjects(), "origin-1", request_timeout_s=60.0, max_migrations=3)
    await pipeline.start()
    await bus.close()
    request = GenerateRequest(input_ids=[5, 6, 7], params=SamplingParams(detokenize=False))
    reply = await pipeline.submit(request)
    assert isinstance(reply, Error) and reply.code == "unavailable" and reply.retriable
    assert pipeline.in_flight == 0  # so it neither counts against the limit nor migrates
    await pipeline.close()
