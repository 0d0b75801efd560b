"""The bench's HTTP clients start the clock ready, as the in-process engine starts it with every
request submitted: each client's connection is open before the first request leaves, and kept for
all of its requests, so the run measures the server, not the clients' set-up."""

import json

from aiohttp import web

from ops.bench.http_clients import run_clients
from ops.bench.requests import BenchRequest, Sampling

CLIENTS = 8


async def test_connections_open_before_the_first_request_and_each_is_kept():
    arrivals: list[tuple[str, int, list[int] | None]] = []  # (route, connection, prompt) in order

    async def generate(request: web.Request) -> web.StreamResponse:
        arrivals.append(("generate", id(request.protocol), json.loads(await request.read())["input_ids"]))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"output_ids": [7]}\n\ndata: {"output_ids": [8]}\n\ndata: [DONE]\n\n')
        return response

    async def health(request: web.Request) -> web.Response:
        arrivals.append(("health", id(request.protocol), None))
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        prompts = [BenchRequest([i, i + 1, i + 2], 2) for i in range(3 * CLIENTS)]
        run = await run_clients(f"http://127.0.0.1:{port}", prompts, CLIENTS, Sampling())
    finally:
        await runner.cleanup()
    assert run.requests == len(prompts) and run.output_tokens == 2 * len(prompts)
    routes = [route for route, _, _ in arrivals]
    assert routes == ["health"] * CLIENTS + ["generate"] * len(prompts)  # every connection opened first
    opened = {connection for route, connection, _ in arrivals if route == "health"}
    assert len(opened) == CLIENTS
    assert {connection for route, connection, _ in arrivals if route == "generate"} == opened  # and kept
    assert sorted(prompt for route, _, prompt in arrivals if prompt) == sorted(p.prompt_ids for p in prompts)
