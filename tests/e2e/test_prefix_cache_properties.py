"""The prefix cache's property test end to end, through HTTP on the demo model: random concurrent
workloads (prompts that share prefixes, n > 1 forks, session turns and branches, clients that hang
up, greedy and seeded sampling) get the same tokens from a server with the prefix cache as from one
without it, and leave `GET /admin/cache` at its idle figures once they are done."""

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field

import httpx
import pytest

from ops.local_server import RunningServer, start_server

BLOCK = 16  # the server's KV block size
KV_BLOCKS = 32  # few enough that the workloads evict cached prefixes, and now and then preempt a request
SCENARIOS = 8  # seeded, so every run costs the same
CLIENTS = 8  # at once in each scenario, by turns a session's, forking, plain
CALLS = 5  # per client, one of them a hang-up
VOCAB = range(10, 2000)  # within the demo model's vocabulary
BLOCK_FIGURES = (
    "total_blocks",
    "free_blocks",
    "cached_blocks",
    "evictable_blocks",
    "in_use_blocks",
    "public_blocks",
    "private_blocks",
)


@dataclass
class Call:
    """One HTTP request of a scenario; `name` labels its output in the runs on both servers."""

    name: str
    route: str
    body: dict
    hang_up_after: int | None = None  # data events the client reads before it goes away
    turn: bool = False  # a turn of the client's session
    parent: str | None = None  # the name of the turn it continues; None: the session's latest


@dataclass
class Client:
    calls: list[Call] = field(default_factory=list)
    session: bool = False


@dataclass
class Result:
    request_id: str
    output: list  # the token ids of /generate, the choices' texts of /v1/completions
    cached_tokens: int | None  # None where a stream does not report it


@pytest.fixture(scope="module")
def servers(server, tmp_path_factory):
    """The demo model that the shared deployment built, served twice more: with the prefix cache, and
    without it as the reference."""
    flags = ("--model", str(server.model_dir), "--num-kv-blocks", str(KV_BLOCKS))
    with contextlib.ExitStack() as running:  # the two step at once, each on one thread (tests/conftest.py)
        cached = start_server(tmp_path_factory.mktemp("cache-on"), *flags)
        running.callback(cached.stop)
        reference = start_server(tmp_path_factory.mktemp("cache-off"), *flags, "--no-prefix-caching")
        running.callback(reference.stop)
        yield cached, reference


def plan(seed: int) -> list[Client]:
    rng = random.Random(seed)
    stems = [[rng.choice(VOCAB) for _ in range(6 * BLOCK)] for _ in range(3)]

    def tokens(count: int) -> list[int]:
        return [rng.choice(VOCAB) for _ in range(count)]

    def prompt() -> list[int]:
        """A cut of a stem that other prompts share, of any length, then a tail of its own."""
        stem = rng.choice(stems)
        return stem[: rng.randint(0, len(stem))] + tokens(rng.randint(1, 20))

    def sampling(max_tokens: int) -> dict:
        drawn = {"temperature": 0} if rng.random() < 0.5 else {"temperature": 1.0, "seed": rng.getrandbits(31)}
        return drawn | {"max_tokens": max_tokens, "ignore_eos": rng.random() < 0.5}

    def sglang_sampling(max_tokens: int) -> dict:
        drawn = sampling(max_tokens)
        return drawn | {"max_new_tokens": drawn.pop("max_tokens")}

    def generate(name: str, input_ids: list[int], stream: bool, hang_up: bool = False) -> Call:
        if hang_up:  # long enough to be cut off
            return Call(
                name,
                "/generate",
                {"input_ids": input_ids, "stream": True, "sampling_params": sglang_sampling(48) | {"ignore_eos": True}},
                hang_up_after=rng.randint(1, 8),
            )
        return Call(
            name,
            "/generate",
            {"input_ids": input_ids, "stream": stream, "sampling_params": sglang_sampling(rng.randint(1, 8))},
        )

    def fork(name: str, hang_up: bool = False) -> Call:
        body = {"model": "demo", "prompt": prompt(), "n": rng.randint(2, 4)}
        if hang_up:
            return Call(
                name,
                "/v1/completions",
                body | sampling(48) | {"stream": True, "ignore_eos": True},
                hang_up_after=rng.randint(1, 8),
            )
        return Call(name, "/v1/completions", body | sampling(rng.randint(1, 8)))

    clients = []
    for c in range(CLIENTS):
        client = Client(session=c % 3 == 0)
        hang_up_at = rng.randrange(1, CALLS)  # never first: a session's first turn completes, for later ones to name
        turns: dict[str, str | None] = {}  # the session's completed turns, as the server keeps them -> their parents
        latest_known = True  # until a turn hangs up: it may be recorded or not, so later turns name their parent
        for i in range(CALLS):
            name, hang_up = f"{c}.{i}", i == hang_up_at
            if c % 3 == 1:
                client.calls.append(fork(name, hang_up))
            elif not client.session:
                client.calls.append(generate(name, prompt(), rng.random() < 0.3, hang_up))
            else:
                call = generate(name, tokens(rng.randint(1, 20)), rng.random() < 0.3, hang_up)
                call.turn = True
                if turns and (not latest_known or rng.random() < 0.5):
                    call.parent = rng.choice(list(turns))  # a branch
                    # Not for a hung-up turn: whether it replaced anything would depend on timing.
                    if not hang_up and rng.random() < 0.5:
                        call.body["session_replace"] = True
                        turns = without_descendants(turns, call.parent)
                latest_known &= not hang_up
                if not hang_up:
                    turns[name] = call.parent if call.parent is not None else next(reversed(turns), None)
                client.calls.append(call)
        clients.append(client)
    return clients


def without_descendants(turns: dict[str, str | None], parent: str) -> dict[str, str | None]:
    """What is left of `turns` once a branch from `parent` replaced the turns after it."""
    dropped = {parent}
    for turn, its_parent in turns.items():  # in the order recorded: parents first
        if its_parent in dropped:
            dropped.add(turn)
    return {turn: its_parent for turn, its_parent in turns.items() if turn == parent or turn not in dropped}


async def send(http: httpx.AsyncClient, call: Call, body: dict) -> Result | None:
    """Runs one call; None for a client that hangs up."""
    if not body.get("stream"):
        response = await http.post(call.route, json=body)
        assert response.status_code == 200, response.text
        reply = response.json()
        if call.route == "/generate":
            return Result(reply["meta_info"]["id"], reply["output_ids"], reply["meta_info"]["cached_tokens"])
        cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
        return Result(reply["id"], [choice["text"] for choice in reply["choices"]], cached)
    request_id, token_ids, events = "", [], 0
    async with http.stream("POST", call.route, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            events += 1
            if events == call.hang_up_after:
                return None  # leaving the block closes the connection mid-stream
            if call.hang_up_after is None and line != "data: [DONE]":  # only /generate streams to the end
                event = json.loads(line.removeprefix("data: "))  # SGLang's: everything so far
                request_id, token_ids = event["meta_info"]["id"], event["output_ids"]
    return Result(request_id, token_ids, None)


async def run_client(http: httpx.AsyncClient, client: Client) -> dict[str, Result]:
    results, session_id = {}, None
    if client.session:
        response = await http.post("/v1/sessions", json={})
        assert response.status_code == 200, response.text
        session_id = response.json()["id"]
    for call in client.calls:
        body = dict(call.body)
        if call.turn:  # SGLang's session_params: the session, the turn to continue, and whether to replace
            turn = {"id": session_id, "replace": body.pop("session_replace", False)}
            if call.parent is not None:
                turn["rid"] = results[call.parent].request_id
            body["session_params"] = turn
        result = await send(http, call, body)
        if result is not None:
            results[call.name] = result
    if session_id is not None:
        assert (await http.delete(f"/v1/sessions/{session_id}")).status_code == 200
    return results


async def settled(http: httpx.AsyncClient, timeout_s: float = 20) -> dict:
    """GET /admin/cache once no request runs and nothing is pinned: a request whose client hung up
    leaves the batch a moment later. Every block is then free or cached, and every cached one evictable."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = (await http.get("/admin/cache")).json()
        if (
            report["in_use_blocks"] == 0
            and report["cached_blocks"] == report["evictable_blocks"]
            and report["free_blocks"] + report["cached_blocks"] == report["total_blocks"]
        ):
            return report
        assert time.monotonic() < deadline, f"the cache did not settle: {report}"
        await asyncio.sleep(0.1)


async def run(server: RunningServer, clients: list[Client]) -> dict[str, Result]:
    """Runs the clients at once, then checks that the server is back where it started: after a
    flush, /admin/cache shows the same blocks as before the scenario."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        before, aborted = await settled(http), len(server.find("request_aborted"))
        results = {}
        for found in await asyncio.gather(*(run_client(http, client) for client in clients)):
            results |= found
        # A hang-up cut a request short (the log may lag the replies a little).
        await asyncio.to_thread(server.wait_for, "request_aborted", timeout_s=10, count=aborted + 1)
        idle = await settled(http)
        flushed = await http.post("/admin/flush_cache")
        assert flushed.json()["freed_blocks"] == idle["evictable_blocks"]
        after = (await http.get("/admin/cache")).json()
        assert {k: after[k] for k in BLOCK_FIGURES} == {k: before[k] for k in BLOCK_FIGURES}
        assert after["free_blocks"] == after["total_blocks"]
    return results


@pytest.mark.parametrize("seed", range(SCENARIOS))
async def test_cache_on_and_off_give_the_same_tokens_and_the_cache_goes_back_to_idle(servers, seed):
    clients = plan(seed)
    with_cache, without = await asyncio.gather(*(run(server, clients) for server in servers))
    completed = {call.name for client in clients for call in client.calls if call.hang_up_after is None}
    assert set(with_cache) == set(without) == completed
    differ = [name for name in completed if with_cache[name].output != without[name].output]
    assert differ == [], [(name, with_cache[name], without[name]) for name in differ]
    # The comparison means something only if the cache served part of the prompts.
    assert sum(r.cached_tokens or 0 for r in with_cache.values()) > 0
    assert all(not r.cached_tokens for r in without.values())
