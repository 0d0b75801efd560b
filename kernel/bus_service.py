"""The bus as a NATS micro service: what stock NATS tooling (`nats micro ls`, `nats micro info`,
`nats micro stats`, or requests on `$SRV.PING`, `$SRV.INFO`, `$SRV.STATS`) reads of an actor.

nats.micro's endpoints make their own subscriptions, always in a queue group ("q" when none is
given), and answer a handler that raises with error headers instead of a typed `Error`: a subject
that several actors must each receive (the step outputs, the heartbeats) would reach only one of
them. So the bus keeps its own subscriptions and counts each here as an `Endpoint`; the service,
nats.micro's own, answers the three discovery verbs with those endpoints and their counts.
kernel/bus.py serves it and kernel/bus_subscriptions.py counts into it; the bus's modules are the only
ones that import nats.
"""

import dataclasses
import time
import typing
from typing import Any

from nats.aio.client import Client
from nats.micro.service import EndpointInfo, EndpointStats, Service, ServiceConfig, ServiceInfo, ServiceStats


class Endpoint:
    """One subscription of the bus, with the counts nats.micro keeps of an endpoint: messages
    handled, those that failed (undecodable, the handler raised, or it answered an `Error`), and the
    time spent handling them, replies included."""

    __slots__ = ("name", "subject", "queue_group", "schema", "requests", "errors", "processing_ns", "last_error")

    def __init__(self, subject: str, queue_group: str, message_type: Any) -> None:
        # micro names allow letters, digits, "-" and "_": llm.heartbeat.* is llm-heartbeat-any
        self.name = subject.replace(".", "-").replace("*", "any").replace(">", "all")
        self.subject = subject
        self.queue_group = queue_group
        self.schema = " | ".join(t.__name__ for t in typing.get_args(message_type) or (message_type,))
        self.requests = 0
        self.errors = 0
        self.processing_ns = 0
        self.last_error = ""

    def record(self, started_ns: int, error: str | None = None) -> None:
        """Counts one message, handled since `started_ns` (time.perf_counter_ns()); `error`: why it failed."""
        self.requests += 1
        self.processing_ns += time.perf_counter_ns() - started_ns
        if error is not None:
            self.errors += 1
            self.last_error = error

    def info(self) -> EndpointInfo:
        return EndpointInfo(self.name, self.subject, self.queue_group, {"schema": self.schema})

    def stats(self) -> EndpointStats:
        return EndpointStats(
            name=self.name,
            subject=self.subject,
            queue_group=self.queue_group,
            num_requests=self.requests,
            num_errors=self.errors,
            processing_time=self.processing_ns,
            average_processing_time=self.processing_ns // self.requests if self.requests else 0,
            last_error=self.last_error,
        )


class BusService(Service):
    """nats.micro's service, its endpoints the bus's subscriptions as they are at each request."""

    def __init__(self, client: Client, config: ServiceConfig, endpoints: list[Endpoint]) -> None:
        super().__init__(client, config)
        self._bus_endpoints = endpoints

    def info(self) -> ServiceInfo:
        return dataclasses.replace(super().info(), endpoints=[e.info() for e in self._bus_endpoints])

    def stats(self) -> ServiceStats:
        return dataclasses.replace(super().stats(), endpoints=[e.stats() for e in self._bus_endpoints])


async def start_service(
    client: Client, endpoints: list[Endpoint], name: str, version: str, description: str, metadata: dict[str, str]
) -> BusService:
    """Answers `$SRV.{PING,INFO,STATS}` (each for every service, for `name`, and for this instance's
    id) until the connection closes. `version` must be a semantic version (nats.micro checks)."""
    service = BusService(client, ServiceConfig(name, version, description, metadata), endpoints)
    await service.start()
    return service
