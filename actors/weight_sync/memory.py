"""Sleep and wake (SGLang's /release_memory_occupation and /resume_memory_occupation), run by the
weight_sync actor: before the executor gives its device memory back, the scheduler retracts what
runs (the requests go back to the queue, to be recomputed after the wake) and, when the KV pool
goes, flushes the prefix cache (its blocks will hold nothing); arrivals wait in the queue. Once
every tag is back, generation continues, unless it was paused before the sleep: then the client
that paused it continues it.
"""

import structlog

from actors.weight_sync.peers import Peers
from schemas.errors import Error
from schemas.sleep import MemoryState, MemoryTag, ReleaseMemory, ResumeMemory

MEMORY_TIMEOUT_S = 120.0  # giving back or taking again every byte of a large model, and recapturing graphs


class MemorySleep:
    def __init__(self, peers: Peers) -> None:
        self.peers = peers
        self.paused_for_sleep = False  # this sleep paused generation, so the wake continues it
        self.log = structlog.get_logger()

    async def release(self, tags: list[MemoryTag] | None) -> MemoryState | Error:
        state = await self.peers.pause_state()
        if isinstance(state, Error):
            return state
        # Retract even under another pause: "wait" lets requests run, "in_place" keeps their KV.
        if isinstance(paused := await self.peers.pause("retract"), Error):
            return paused
        self.paused_for_sleep = self.paused_for_sleep or not state.paused
        if tags is None or "kv_cache" in tags:
            if isinstance(flushed := await self.peers.flush_cache(), Error):
                await self._wake_generation()
                return flushed
        released = await self.peers.executor(ReleaseMemory(tags), MEMORY_TIMEOUT_S)
        if isinstance(released, Error):
            await self._wake_generation()
            return released
        self.log.info("memory_released", tags=tags, released=released.released, device_bytes=released.device_bytes)
        return released

    async def resume(self, tags: list[MemoryTag] | None) -> MemoryState | Error:
        resumed = await self.peers.executor(ResumeMemory(tags), MEMORY_TIMEOUT_S)
        if isinstance(resumed, Error):
            return resumed
        self.log.info("memory_resumed", tags=tags, released=resumed.released, device_bytes=resumed.device_bytes)
        if not resumed.released:
            await self._wake_generation()
        return resumed

    async def _wake_generation(self) -> None:
        if not self.paused_for_sleep:
            return
        resumed = await self.peers.resume()
        if isinstance(resumed, Error):
            self.log.error("generation_not_resumed", error=resumed.message)
            return
        self.paused_for_sleep = False
