"""Streaming requests through a weight update (`python -m ops.bench.weight_update`, part d): many
greedy streams on `/generate` run while a trainer pauses generation in one mode, updates and
continues; then every stream is checked: none lost, no token repeated or missing (the tokens
streamed are those the server counted, and as many as asked), and every token's version exact.

In abort mode each aborted stream comes back with its partial output, and the client resumes it as
SGLang's clients do (docs/api.md, "Aborts"): prompt + output so far as the new prompt, for the
tokens still missing; the parts are checked as one stream.
"""

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from ops.bench.records import StreamsThroughUpdate

STARTED_TOKENS = 2  # a stream counts as running once this many tokens came
START_TIMEOUT_S = 300.0


@dataclass
class Part:
    """One request of a stream: per event its tokens and version, and the server's own account."""

    events: list[tuple[list[int], str]] = field(default_factory=list)
    spans: list[list] = field(default_factory=list)  # [[first output index, version], ...] of the part
    completion_tokens: int = 0
    finish: str | None = None

    @property
    def tokens(self) -> list[int]:
        return [t for ids, _ in self.events for t in ids]


class Stream:
    def __init__(self, prompt: list[int], new_tokens: int) -> None:
        self.prompt, self.new_tokens = prompt, new_tokens
        self.parts: list[Part] = []
        self.received = 0  # tokens so far, over the parts
        self.error = ""

    async def run(self, session: aiohttp.ClientSession, url: str) -> None:
        try:
            while self.received < self.new_tokens:
                part = await self._part(session, url, self.prompt + [t for p in self.parts for t in p.tokens])
                self.parts.append(part)
                if part.finish != "abort":
                    break  # done, or cut short for another reason: counted as lost below
        except (aiohttp.ClientError, KeyError, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    async def _part(self, session: aiohttp.ClientSession, url: str, input_ids: list[int]) -> Part:
        params = {"max_new_tokens": self.new_tokens - self.received, "temperature": 0, "ignore_eos": True}
        part = Part()
        body = {"input_ids": input_ids, "sampling_params": params, "stream": True}
        async with session.post(f"{url}/generate", json=body) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}: {await response.text()}")
            async for line in response.content:  # the server streams incrementally: each event what is new
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[len(b"data: ") :])
                meta = event["meta_info"]
                if event["output_ids"]:
                    part.events.append((event["output_ids"], meta["weight_version"]))
                    self.received += len(event["output_ids"])
                part.spans, part.completion_tokens = meta["version_spans"], meta["completion_tokens"]
                part.finish = (meta.get("finish_reason") or {}).get("type", part.finish)
        return part


def version_errors(stream: Stream, old: str, new: str, before_pause: int) -> int:
    """Tokens whose version is not exact: each event's version must be its last token's by the
    part's spans; the versions go old then new, never back; no token that came before the pause
    was asked is new; an aborted part is all old, the part resuming it all new."""
    errors, versions = 0, []
    for part in stream.parts:
        starts = [start for start, _ in part.spans]
        if starts[:1] != [0] or starts != sorted(starts):
            return len(part.tokens) or 1
        by_index = []
        for (start, version), end in zip(part.spans, [*starts[1:], len(part.tokens)]):
            by_index += [version] * (end - start)
        if len(by_index) != len(part.tokens):
            return len(part.tokens) or 1
        position = 0
        for ids, version in part.events:
            position += len(ids)
            errors += len(ids) * (by_index[position - 1] != version)
        if part.finish == "abort" and new in by_index:
            errors += by_index.count(new)
        versions += by_index
    order = {old: 0, new: 1}
    errors += sum(v not in order for v in versions)
    ranks = [order.get(v, 0) for v in versions]
    errors += sum(1 for a, b in zip(ranks, ranks[1:]) if b < a)
    errors += sum(1 for v in versions[:before_pause] if v == new)
    return errors


async def streams_through_update(
    url: str,
    prompts: list[list[int]],
    new_tokens: int,
    mode: str,
    old: str,
    new: str,
    update: Callable[[], Awaitable[float]],
) -> StreamsThroughUpdate:
    """Starts a stream per prompt; once each has tokens, `update()` (a pause in `mode`, the update
    to version `new`, the continue; it returns the pause-to-resume seconds); then checks them all."""
    streams = [Stream(p, new_tokens) for p in prompts]
    connector = aiohttp.TCPConnector(limit=len(streams))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        async with asyncio.TaskGroup() as group:
            for stream in streams:
                group.create_task(stream.run(session, url))
            async with asyncio.timeout(START_TIMEOUT_S):
                while not all(s.received >= STARTED_TOKENS or s.error for s in streams):
                    await asyncio.sleep(0.005)
            before_pause = [s.received for s in streams]
            pause_s = await update()
    lost = [s for s in streams if s.error or s.received != new_tokens]
    counted = sum(abs(len(p.tokens) - p.completion_tokens) for s in streams for p in s.parts)
    return StreamsThroughUpdate(
        mode=mode,
        streams=len(streams),
        tokens_each=new_tokens,
        lost=len(lost),
        repeated_or_missing=counted + sum(abs(s.received - new_tokens) for s in streams),
        version_errors=sum(version_errors(s, old, new, b) for s, b in zip(streams, before_pause)),
        switched=sum(1 for s in streams if {v for p in s.parts for _, v in p.events} == {old, new}),
        resumed_parts=sum(len(s.parts) - 1 for s in streams),
        pause_to_resume_s=pause_s,
        errors=sorted({s.error for s in lost if s.error})[:5],
    )
