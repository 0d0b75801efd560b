"""One weight update as a transaction, run by the weight_sync actor: pause generation as asked,
load the new weights into the executor while the prefix cache starts a new generation (unless the
update keeps it), commit the version, resume. One at a time: a second update while one runs is
refused. A failed load leaves the old weights serving (the executor restored them) under the old
version, and the trainer gets the executor's Error.

The pause: `pause_mode`, else "abort" with `abort_all_requests`, else "wait" (SGLang's default: the
running requests finish first; arrivals wait in the queue). An update that finds generation paused
already (by `PauseGeneration`) leaves it paused: the client that paused it continues it.
"""

import asyncio
import time
import uuid
from dataclasses import dataclass

import structlog

from actors.weight_sync.peers import Peers
from actors.weight_sync.versions import VersionBook
from schemas.admin import PauseState
from schemas.admin_weights import (
    FinishBusUpload,
    UpdateFromDisk,
    UpdateFromDistributed,
    UpdateFromTensor,
    UpdatePause,
    WeightsUpdated,
    WeightVersion,
)
from schemas.errors import Error
from schemas.executor_weights import ApplyWeights, SetVersion, WeightsApplied, WeightSource
from schemas.scheduler_weights import WeightsCommitted

# A load from disk runs at the disk's rate (16 GB: a minute on a slow one); a trainer's group has
# its own deadline inside the executor. Past this the executor is taken for gone.
APPLY_TIMEOUT_S = 900.0
IDLE_POLL_S = 0.05  # how often a "wait" pause asks whether the running requests have finished
COMMIT_ATTEMPTS = 3


@dataclass(frozen=True)
class UpdateOptions:
    """What every kind of update says about the pause, the version and the cache."""

    weight_version: str | None
    abort_all_requests: bool
    flush_cache: bool
    pause_mode: UpdatePause | None

    @classmethod
    def of(
        cls, message: UpdateFromDisk | UpdateFromDistributed | UpdateFromTensor | FinishBusUpload
    ) -> "UpdateOptions":
        return cls(message.weight_version, message.abort_all_requests, message.flush_cache, message.pause_mode)

    @property
    def mode(self) -> UpdatePause:
        return self.pause_mode or ("abort" if self.abort_all_requests else "wait")


class WeightTransactions:
    """The exclusive operations on the weights (updates, renames, sleep and wake), one at a time:
    `claim` before starting one (synchronously, so two callers cannot both win), `release` after."""

    def __init__(self, peers: Peers, versions: VersionBook) -> None:
        self.peers = peers
        self.versions = versions
        self.busy: str | None = None  # what runs now
        self.log = structlog.get_logger()

    def claim(self, what: str) -> Error | None:
        if self.busy is not None:
            return Error(
                "invalid_request",
                f"{self.busy} is running: one weight operation at a time; send this one after it ends",
                retriable=True,
            )
        self.busy = what
        return None

    def release(self) -> None:
        self.busy = None

    async def update(
        self, source: WeightSource, full: bool, options: UpdateOptions, model_path: str | None = None
    ) -> WeightsUpdated | Error:
        """Runs one update (the caller holds the claim). `model_path`: the checkpoint an
        UpdateFromDisk names, which /get_model_info reports after it."""
        update_id = uuid.uuid4().hex[:12]
        version = self.versions.next_version(options.weight_version)
        log = self.log.bind(update_id=update_id, version=version, source=type(source).__name__)
        paused_at = time.perf_counter()
        paused = await self._pause(options)
        if isinstance(paused, Error):
            return paused
        paused_here, num_paused = paused
        # Generation is paused: no KV is computed until the resume, so the cache may start its new
        # generation while the executor loads (a trainer sends an update per bucket: one bus round
        # trip fewer each). A failed load has then only cost the cache its old entries.
        applied, _ = await asyncio.gather(
            self.peers.executor(ApplyWeights(update_id, source, version, full), APPLY_TIMEOUT_S),
            self._commit_to_cache(WeightsCommitted(version, keep_cache=not options.flush_cache)),
        )
        if isinstance(applied, Error):
            applied = await self._outcome_unknown(applied, version)
        if isinstance(applied, Error):
            log.warning("weights_update_failed", error=applied.message, serving=self.versions.version)
            await self._commit_to_cache(WeightsCommitted(self.versions.version, keep_cache=True))  # its name back
            if paused_here:
                await self._resume()
            return applied
        try:
            self.versions.commit(version, model_path)  # a file of a few bytes: a thread's handoff costs more
        finally:  # the file may fail (a full disk): generation goes on all the same
            if paused_here:
                await self._resume()
        pause_s = time.perf_counter() - paused_at if paused_here else 0.0
        log.info("weights_updated", tensors=applied.tensors, bytes=applied.bytes, pause_s=round(pause_s, 3))
        return WeightsUpdated(
            True,
            f"weights updated to version {version}",
            version,
            num_paused,
            applied.tensors,
            applied.bytes,
            pause_s,
            applied.seconds,
        )

    async def rename(self, version: str, abort_all_requests: bool) -> WeightVersion | Error:
        """Names the serving weights `version` (SGLang's /update_weight_version), first ending the
        requests in flight if asked: their tokens would carry the old name."""
        if abort_all_requests and isinstance(aborted := await self.peers.abort_all(), Error):
            return aborted
        renamed = await self.peers.executor(SetVersion(version), APPLY_TIMEOUT_S)
        if isinstance(renamed, Error):
            return renamed
        self.versions.rename(version)
        await self._commit_to_cache(WeightsCommitted(version, keep_cache=True))  # same weights, same KV
        self.log.info("weight_version_renamed", version=version)
        return WeightVersion(version, self.versions.model_path)

    async def _pause(self, options: UpdateOptions) -> tuple[bool, int] | Error:
        """Pauses generation as `options` ask unless it is paused already; returns whether this
        update paused it, and how many requests in flight it paused (or ended)."""
        state = await self.peers.pause_state()
        if isinstance(state, Error):
            return state
        if state.paused and not options.abort_all_requests:
            return False, 0
        mode = "abort" if state.paused else options.mode
        paused = await self.peers.pause(mode)
        if isinstance(paused, Error):
            return paused
        if mode == "wait":
            while (running := await self.peers.running_requests()) != 0:
                if isinstance(running, Error):
                    await self._resume()
                    return running
                await asyncio.sleep(IDLE_POLL_S)
        return not state.paused, _paused_count(paused)

    async def _outcome_unknown(self, failure: Error, version: str) -> WeightsApplied | Error:
        """An apply that failed on the wire (timeout, the executor gone) may have committed or not:
        the executor's own version says which; the book follows it either way."""
        if failure.code not in ("timeout", "unavailable"):
            return failure
        info = await self.peers.describe_executor()
        if isinstance(info, Error):
            return failure
        if info.weight_version == version:  # committed before the reply was lost: the caller counts it
            return WeightsApplied(version, 0, 0, 0.0)
        if self.versions.follow(info.weight_version):
            self.log.warning("executor_version_differs", serving=info.weight_version)
        return failure

    async def _commit_to_cache(self, message: WeightsCommitted) -> None:
        """Tells the scheduler; a scheduler that cannot be reached is retried, then logged: a
        restarted one starts with an empty cache anyway."""
        for _ in range(COMMIT_ATTEMPTS):
            generation = await self.peers.commit(message)
            if not isinstance(generation, Error):
                return
        self.log.error("cache_generation_unknown", version=message.version, error=generation.message)

    async def _resume(self) -> None:
        resumed = await self.peers.resume()
        if isinstance(resumed, Error):
            self.log.error("generation_not_resumed", error=resumed.message)


def _paused_count(state: PauseState) -> int:
    """The requests a pause touched: those it ended in "abort", else those it holds."""
    return state.aborted if state.mode == "abort" else state.held
