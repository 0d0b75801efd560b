"""Device memory and the prefix cache over HTTP: sleep and wake under SGLang's names
(`/release_memory_occupation`, `/resume_memory_occupation`, each GET or POST) and vLLM's (`/sleep`,
`/wake_up`, `/is_sleeping`), and the cache flushes RL clients call around an update (SGLang's
`/flush_cache`, vLLM's `/reset_prefix_cache`). Admin routes (tenants.py).

Sleep and wake are one request each to the weight_sync actor, which retracts what runs and has the
executor give the tagged memory back to the driver (or take it again); the requests retracted go on
after the wake, so none is lost. The flushes are the scheduler's, which owns the prefix cache.
"""

from aiohttp import web

from actors.frontdoor import weight_bodies as bodies
from actors.frontdoor.http_errors import error_response
from actors.frontdoor.request_fields import invalid
from actors.frontdoor.weight_routes import unexpected
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.admin import CacheFlushed, FlushCache, GetStats, SchedulerStats
from schemas.admin_weights import WeightsReply
from schemas.errors import Error
from schemas.sleep import GetMemory, MemoryState, MemoryTag, ReleaseMemory, ResumeMemory

# Release retracts what runs and frees the KV pool and graphs; resume allocates them again and
# recaptures the graphs: seconds, on a large model.
MEMORY_TIMEOUT_S = 300.0
CACHE_TIMEOUT_S = 5.0
SLEEP_LEVELS = ("1", "2")
TAGS: tuple[MemoryTag, ...] = ("weights", "kv_cache", "cuda_graph")


class MemoryRoutes:
    def __init__(self, bus: Bus, subjects: Subjects) -> None:
        self.bus = bus
        self.subjects = subjects

    def add_to(self, router: web.UrlDispatcher) -> None:
        for path, handler in (
            ("/release_memory_occupation", self.release),
            ("/resume_memory_occupation", self.resume),
            ("/flush_cache", self.flush_cache),
        ):
            router.add_get(path, handler)
            router.add_post(path, handler)
        router.add_post("/sleep", self.sleep)
        router.add_post("/wake_up", self.wake_up)
        router.add_get("/is_sleeping", self.is_sleeping)
        router.add_post("/reset_prefix_cache", self.reset_prefix_cache)

    async def release(self, request: web.Request) -> web.Response:
        """SGLang's: `{}`, `{"tags": null}` (every tag) or `{"tags": [...]}`."""
        message = bodies.parse_release(await request.read())
        if isinstance(message, Error):
            return error_response(message)
        return _state(await self._ask(message), "Memory released.")

    async def resume(self, request: web.Request) -> web.Response:
        message = bodies.parse_resume(await request.read())
        if isinstance(message, Error):
            return error_response(message)
        return _state(await self._ask(message), "Memory resumed.")

    async def sleep(self, request: web.Request) -> web.Response:
        """vLLM's `?level=1|2`. Level 2 (vLLM drops the weights, for an update to replace) keeps a host
        copy here as level 1 does: the device memory goes back to the driver either way."""
        level = request.query.get("level", "1")
        if level not in SLEEP_LEVELS:
            return error_response(invalid(f"level must be one of {list(SLEEP_LEVELS)}, not {level!r}", "level"))
        return _state(await self._ask(ReleaseMemory()), "Sleeping.")

    async def wake_up(self, request: web.Request) -> web.Response:
        """vLLM's `?tags=weights&tags=kv_cache`; none: every tag."""
        tags = request.query.getall("tags", [])
        if unknown := [tag for tag in tags if tag not in TAGS]:
            return error_response(invalid(f"unknown tags {unknown}: the tags are {list(TAGS)}", "tags"))
        return _state(await self._ask(ResumeMemory(tags or None)), "Awake.")

    async def is_sleeping(self, _request: web.Request) -> web.Response:
        reply = await self._ask(GetMemory(), CACHE_TIMEOUT_S)
        if not isinstance(reply, MemoryState):
            return unexpected(reply)
        return web.json_response({"is_sleeping": bool(reply.released)})

    async def flush_cache(self, request: web.Request) -> web.Response:
        """SGLang's: 200 once the cache is flushed; 400 while requests run, for the client to retry
        (slime and others poll it until 200 before they release memory or update weights). Paused
        requests do not run: a flush after `/pause_generation` answers 200."""
        stats = await self.bus.request(self.subjects.admin_stats, GetStats(), SchedulerStats, CACHE_TIMEOUT_S)
        if isinstance(stats, Error):
            return error_response(stats)
        if stats.running:
            message = f"{stats.running} requests are running: the cache is flushed when none runs; retry"
            return error_response(Error("invalid_request", message, retriable=True))
        return await self.reset_prefix_cache(request)

    async def reset_prefix_cache(self, _request: web.Request) -> web.Response:
        """vLLM's: drops every cached block no running request reads, whatever runs."""
        flushed = await self.bus.request(self.subjects.admin_flush_cache, FlushCache(), CacheFlushed, CACHE_TIMEOUT_S)
        if isinstance(flushed, Error):
            return error_response(flushed)
        return web.json_response({"success": True, "message": "Cache flushed.", "freed_blocks": flushed.freed_blocks})

    async def _ask(self, message, timeout_s: float = MEMORY_TIMEOUT_S) -> WeightsReply | Error:
        return await self.bus.request(self.subjects.admin_weights, message, WeightsReply, timeout_s)


def _state(reply: WeightsReply | Error, message: str) -> web.Response:
    """SGLang answers nothing but 200; slime reads a JSON body: the memory's state after the call."""
    if not isinstance(reply, MemoryState):
        return unexpected(reply)
    fields = {"success": True, "message": message, "released": reply.released, "device_bytes": reply.device_bytes}
    return web.json_response(fields)
