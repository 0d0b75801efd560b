"""Aborts that a client asks for and waits out, at the origin: the request ends with finish_reason
"abort" after every token its client got, and their logprobs.

The scheduler ends what it knows (a running request through the executor's next step output, a
waiting one at once); this object marks the streams as aborting first, so that no migration
submits them again, and ends itself any whose end does not come within `end_wait_s` (the scheduler
did not know it: a migration was between its abort and its submit, the scheduler restarted, or the
request ended meanwhile, and then its own end comes first). It owns those waits: `close` cancels
and awaits them.
"""

import asyncio

import structlog

from actors.lib.origin.downstream import Downstream
from actors.lib.origin.request_stream import RequestStream
from schemas.errors import Error
from schemas.requests import Tenant

log = structlog.get_logger()
END_WAIT_S = 5.0  # far more than a step takes, however full the batch


class Aborts:
    def __init__(self, downstream: Downstream, end_wait_s: float = END_WAIT_S) -> None:
        self._downstream = downstream
        self._end_wait_s = end_wait_s
        self._tasks: set[asyncio.Task] = set()

    async def abort(self, streams: list[RequestStream]) -> None:
        """Ends `streams`, keeping their output."""
        for stream in streams:
            stream.aborting = True
        replies = await asyncio.gather(*(self._downstream.abort_keeping_output(s.request_id) for s in streams))
        for stream, reply in zip(streams, replies):
            if isinstance(reply, Error):
                log.warning("abort_not_confirmed", request_id=stream.request_id, error=reply.message)
            self._await_end(stream)

    async def abort_all(self, tenant: Tenant | None, streams: list[RequestStream]) -> list[str] | Error:
        """Ends every request of `tenant` (None: of everyone), at any origin, keeping their output;
        `streams` are this origin's among them. Returns the ids the scheduler aborted."""
        for stream in streams:
            stream.aborting = True
        reply = await self._downstream.abort_all(tenant)
        for stream in streams:
            self._await_end(stream)
        return reply if isinstance(reply, Error) else reply.request_ids

    def _await_end(self, stream: RequestStream) -> None:
        task = asyncio.create_task(self._end_in_time(stream), name=f"abort {stream.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _end_in_time(self, stream: RequestStream) -> None:
        try:
            await asyncio.wait_for(stream.ended.wait(), self._end_wait_s)
        except TimeoutError:
            log.info("abort_ended_at_origin", request_id=stream.request_id)
            stream.end_aborted()
            # A run the scheduler did not know then (its submit was on the way) may run now: stop it.
            await self._downstream.abort(stream.request_id)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
