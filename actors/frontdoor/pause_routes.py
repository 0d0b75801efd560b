"""Pausing generation over HTTP, under SGLang's names (`/pause_generation`, `/continue_generation`)
and vLLM's (`/pause?mode=`, `/resume`, `/is_paused`): admin routes (tenants.py), each one request
to the scheduler, which owns the pause (actors/scheduler/pause.py)."""

import asyncio
from typing import Literal

import msgspec
from aiohttp import web

from actors.frontdoor.http_errors import error_response
from actors.frontdoor.request_fields import decode_body, invalid
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.admin import (
    CacheFlushed,
    ContinueGeneration,
    FlushCache,
    GetPause,
    GetStats,
    PauseGeneration,
    PauseState,
    SchedulerStats,
)
from schemas.errors import Error

PAUSE_TIMEOUT_S = 5.0
DRAIN_POLL_S = 0.02
DRAIN_TIMEOUT_S = 600.0  # vLLM's "wait" answers once what runs has finished: a long generation may take minutes
VLLM_MODES = {"abort": "abort", "wait": "wait", "keep": "in_place"}


class PauseBody(msgspec.Struct, forbid_unknown_fields=True):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueBody(msgspec.Struct, forbid_unknown_fields=True):
    # SGLang's; accepted, with no effect: the executor's KV pool and weights stay where they are.
    torch_empty_cache: bool = False


class PauseRoutes:
    def __init__(self, bus: Bus, subjects: Subjects) -> None:
        self.bus = bus
        self.subjects = subjects

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_post("/pause_generation", self.pause_generation)
        router.add_post("/continue_generation", self.continue_generation)
        router.add_post("/pause", self.pause)
        router.add_post("/resume", self.resume)
        router.add_get("/is_paused", self.is_paused)

    async def pause_generation(self, request: web.Request) -> web.Response:
        """SGLang's: `{}` (abort) or `{"mode": "abort" | "retract" | "in_place"}`."""
        body = decode_body(await request.read() or b"{}", PauseBody)
        if isinstance(body, Error):
            return error_response(body)
        reply = await self._ask(self.subjects.admin_pause, PauseGeneration(body.mode))
        return _answer(reply, message="Generation paused successfully.")

    async def continue_generation(self, request: web.Request) -> web.Response:
        """SGLang's: `{}` or `{"torch_empty_cache": true}`; 400 when generation is not paused."""
        body = decode_body(await request.read() or b"{}", ContinueBody)
        if isinstance(body, Error):
            return error_response(body)
        reply = await self._ask(self.subjects.admin_continue, ContinueGeneration())
        return _answer(reply, message="Generation continued successfully.")

    async def pause(self, request: web.Request) -> web.Response:
        """vLLM's: `?mode=abort|wait|keep` (keep: in place; before `mode`, vLLM's clients asked for
        "wait" with `?wait_for_inflight_requests=true`) and `?clear_cache=` (vLLM's default true,
        ignored by "keep") to flush the prefix cache once paused. With "wait" it answers once the
        running requests have finished."""
        flags = {}
        for flag, default in (("wait_for_inflight_requests", "false"), ("clear_cache", "true")):
            flags[flag] = request.query.get(flag, default).lower()
            if flags[flag] not in ("true", "false"):
                return error_response(invalid(f"{flag} must be true or false", flag))
        default_mode = "wait" if flags["wait_for_inflight_requests"] == "true" else "abort"
        mode = VLLM_MODES.get(request.query.get("mode", default_mode))
        if mode is None:
            return error_response(invalid(f"mode must be one of {sorted(VLLM_MODES)}", "mode"))
        reply = await self._ask(self.subjects.admin_pause, PauseGeneration(mode))
        if not isinstance(reply, Error) and mode == "wait":
            reply = await self._drained()
        if not isinstance(reply, Error) and flags["clear_cache"] == "true" and mode != "in_place":
            flushed = await self.bus.request(
                self.subjects.admin_flush_cache, FlushCache(), CacheFlushed, PAUSE_TIMEOUT_S
            )
            reply = flushed if isinstance(flushed, Error) else reply
        return _answer(reply, status="paused")

    async def resume(self, _request: web.Request) -> web.Response:
        """vLLM's: resuming what is not paused is no error there (clients call it to be sure), unlike
        SGLang's /continue_generation."""
        state = await self._ask(self.subjects.admin_pause_state, GetPause())
        if isinstance(state, PauseState) and not state.paused:
            return _answer(state, status="resumed")
        return _answer(await self._ask(self.subjects.admin_continue, ContinueGeneration()), status="resumed")

    async def is_paused(self, _request: web.Request) -> web.Response:
        reply = await self._ask(self.subjects.admin_pause_state, GetPause())
        return error_response(reply) if isinstance(reply, Error) else web.json_response({"is_paused": reply.paused})

    async def _ask(self, subject: str, message) -> PauseState | Error:
        return await self.bus.request(subject, message, PauseState, PAUSE_TIMEOUT_S)

    async def _drained(self) -> PauseState | Error:
        """Polls the scheduler until no request runs (paused, none starts), then answers the pause's state."""
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                while True:
                    stats = await self.bus.request(
                        self.subjects.admin_stats, GetStats(), SchedulerStats, PAUSE_TIMEOUT_S
                    )
                    if isinstance(stats, Error) or stats.running == 0:
                        break
                    await asyncio.sleep(DRAIN_POLL_S)
        except TimeoutError:
            return Error("timeout", f"requests still running after {DRAIN_TIMEOUT_S:.0f} s; still paused")
        return stats if isinstance(stats, Error) else await self._ask(self.subjects.admin_pause_state, GetPause())


def _answer(reply: PauseState | Error, **fields: str) -> web.Response:
    """SGLang's and vLLM's reply fields, with the pause's state after the call."""
    if isinstance(reply, Error):
        return error_response(reply)
    return web.json_response(fields | msgspec.to_builtins(reply))
