"""Carrying out the migrations that `MigrationPolicy` decides: each moves one request, in a task of
its own. This object owns those tasks: a move that raises is logged and fails its request with a
retriable error, so neither the failure nor the waiting client is lost; `close` cancels and awaits
what is still moving.
"""

import asyncio

import structlog

from actors.lib.origin.downstream import Downstream
from actors.lib.origin.migration_policy import Migration, MigrationPolicy
from actors.lib.origin.request_stream import RequestStream
from schemas.errors import Error

log = structlog.get_logger()
RETRY_INTERVAL_S = 0.25


class Migrations:
    def __init__(self, downstream: Downstream, policy: MigrationPolicy, retry_for_s: float) -> None:
        self._downstream = downstream
        self._policy = policy
        self._retry_for_s = retry_for_s  # how long a move retries a retriable failure
        self._tasks: set[asyncio.Task] = set()

    def start(self, stream: RequestStream, migration: Migration) -> None:
        task = asyncio.create_task(self._move(stream, migration), name=f"migrate {stream.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def start_all(self, running: list[RequestStream], migration: Migration) -> None:
        """Moves those of the `running` requests that `migration` affects."""
        for stream in running:
            if migration.affects(stream.record):
                self.start(stream, migration)

    async def _move(self, stream: RequestStream, migration: Migration) -> None:
        try:
            await self._migrate(stream, migration)
        except Exception as exc:  # one request's failure must not go unseen, nor leave its client waiting
            log.exception("migration_failed", request_id=stream.request_id, reason=migration.reason)
            stream.fail(
                Error("internal", f"the request could not be migrated: {type(exc).__name__}: {exc}", retriable=True)
            )

    async def _migrate(self, stream: RequestStream, migration: Migration) -> None:
        record = stream.record
        if stream.aborting:
            return  # its client aborted it: it ends where it stands, and runs no more
        if error := self._policy.count_move(record):
            stream.fail(error)
            return
        log.info(
            "request_migrating",
            request_id=record.request_id,
            reason=migration.reason,
            delivered=len(record.delivered_ids),
        )
        if migration.retrack and record.params.detokenize:
            reply = await self._retry(lambda: self._downstream.track(record))
            if isinstance(reply, Error):
                stream.fail(reply)
                return
        if not stream.running or stream.aborting:
            return  # its end came meanwhile, or its client aborted it: nothing left to compute
        await self._downstream.abort(record.request_id, reason="migrate")
        reply = await self._retry(lambda: self._downstream.submit(record))
        if isinstance(reply, Error):
            stream.fail(reply)
        elif not stream.running or stream.aborting:
            # The old run's end came while this one was submitted, or the client aborted it and its
            # abort missed this run (the origin ends it): stop this one.
            await self._downstream.abort(record.request_id, reason="ended")

    async def _retry(self, attempt):
        """Repeats `attempt` while it fails with a retriable error, for up to `retry_for_s`."""
        deadline = asyncio.get_running_loop().time() + self._retry_for_s
        while True:
            reply = await attempt()
            if not (isinstance(reply, Error) and reply.retriable) or asyncio.get_running_loop().time() > deadline:
                return reply
            await asyncio.sleep(RETRY_INTERVAL_S)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        # Each move handles its own failure (`_move`), so what gather collects here is cancellations.
        await asyncio.gather(*self._tasks, return_exceptions=True)
