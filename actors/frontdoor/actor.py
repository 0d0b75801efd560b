"""The frontdoor actor: the HTTP server and the bus API, both origins of the requests they take."""

from aiohttp import web

from actors.frontdoor.bus_api import BusApi
from actors.frontdoor.http_app import HttpApi
from actors.frontdoor.pipeline import RequestPipeline
from actors.frontdoor.tenants import Tenants
from kernel.actor import Actor
from schemas.generate import GenerateRequest

QUEUE_GROUP = "frontdoors"


class FrontdoorActor(Actor):
    """Serves the OpenAI-compatible HTTP API and the `generate` bus API."""

    name = "frontdoor"

    async def start(self) -> None:
        cfg = self.config
        self.pipeline = RequestPipeline(self.bus, self.subjects, self.instance_id, cfg.request_timeout_s, cfg.max_migrations)
        await self.pipeline.start()
        self.spawn(self.pipeline.watch_liveness(), "watch_liveness")
        self.bus_api = BusApi(self.bus, self.pipeline, cfg.model_name)
        await self.bus.subscribe(self.subjects.generate, GenerateRequest, self.bus_api.on_generate, queue=QUEUE_GROUP)
        tenants = Tenants.from_config(cfg.api_keys, cfg.admin_key)
        app = HttpApi(self.pipeline, cfg.model_name, cfg.max_body_bytes, cfg.max_concurrent_requests, tenants).build_app()
        # Cancel a handler when its client disconnects, so a dropped request is aborted at once.
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, cfg.host, cfg.port, reuse_address=True)
        await site.start()
        self.log.info("http_listening", url=f"http://{cfg.host}:{cfg.port}")

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.bus_api.close()
        await self.pipeline.close()
