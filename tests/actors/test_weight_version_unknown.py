"""While the weight_sync actor is down (it restarts), the routes that name the serving weights
answer a retriable 503 through a real bus: never the name the server started with, which an update
may have replaced."""

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from actors.frontdoor.http_errors import errors_as_json
from actors.frontdoor.weight_routes import WeightRoutes
from kernel.bus import Bus
from kernel.subjects import Subjects


async def test_the_version_is_unavailable_while_weight_sync_is_down(nats_url):
    bus = await Bus.connect(nats_url, "frontdoor")
    app = web.Application(middlewares=[errors_as_json])
    WeightRoutes(bus, Subjects()).add_to(app.router)
    try:
        async with TestClient(TestServer(app)) as http:
            response = await http.get("/get_weight_version")
            body = await response.json()
        assert response.status == 503, body
        assert "weight_version" not in body and body["error"]["type"], body
    finally:
        await bus.close()
