"""The origin's book of its requests in flight: every choice of every request it took, from its
submission until its client closes it. Outputs reach a request only through the book, so those of
a request not in it (it ended, or was never this origin's) are dropped. No I/O: the pipeline opens
and closes entries and hands it what arrives.
"""

from actors.lib.origin.request_stream import RequestStream
from kernel.tenants import may_abort
from schemas.requests import OutputBatch, Tenant
from schemas.step import StepOutput


class RequestBook:
    """Request id -> the stream of that request (one per choice: a choice is a request downstream)."""

    def __init__(self) -> None:
        self._streams: dict[str, RequestStream] = {}

    def __len__(self) -> int:
        return len(self._streams)

    def open(self, stream: RequestStream) -> None:
        self._streams[stream.request_id] = stream

    def close(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def deliver(self, batch: OutputBatch) -> None:
        """A tokenizer's outputs, each to its request."""
        for output in batch.outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.deliver(output)

    def deliver_step(self, step: StepOutput) -> None:
        """The executor's step, to the requests that want no text; a tokenizer turns the others'
        updates into the outputs `deliver` takes."""
        for update in step.updates:
            stream = self._streams.get(update.request_id)
            if stream is not None and not stream.record.params.detokenize:
                stream.deliver_step(update, step.weight_version)

    def of_client(self, client_request_id: str, tenant: Tenant | None) -> list[RequestStream]:
        """The running choices of the request its client knows as `client_request_id`, if
        `tenant` may abort it (kernel/tenants.py:may_abort)."""
        return [
            stream
            for stream in self.running()
            if stream.record.client_request_id == client_request_id and may_abort(tenant, stream.record.tenant)
        ]

    def of_tenant(self, tenant: Tenant | None) -> list[RequestStream]:
        """The running requests that `tenant` may abort."""
        return [stream for stream in self.running() if may_abort(tenant, stream.record.tenant)]

    def running(self) -> list[RequestStream]:
        """The requests that may still run downstream (their end has neither come nor been read)."""
        return [stream for stream in self._streams.values() if stream.running]

    def stalled(self, now: float, stall_s: float) -> list[RequestStream]:
        """The running requests that got nothing for `stall_s`. Each is timed anew from `now`, as it
        is about to move: it counts as stalled again only after another `stall_s` without progress."""
        stalled = [stream for stream in self.running() if now - stream.progressed_at > stall_s]
        for stream in stalled:
            stream.progressed_at = now
        return stalled
