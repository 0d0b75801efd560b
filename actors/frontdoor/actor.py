"""The frontdoor actor: the HTTP server, origin of the requests it takes."""

from aiohttp import web

from actors.frontdoor.http_app import HttpApi
from actors.frontdoor.sglang_info import ServerFacts
from actors.frontdoor.tenants import Tenants
from actors.lib.chat_format import ChatFormat
from actors.lib.origin.pipeline import RequestPipeline
from kernel.actor import Actor

# Connections the kernel queues until we accept them, so a burst of new clients is taken at once,
# those over max_concurrent_requests included (they get a quick 429). With aiohttp's default of
# 128 the kernel drops the other handshakes, which TCP retries only a second later. The kernel caps
# it at net.core.somaxconn.
LISTEN_BACKLOG = 4096


class FrontdoorActor(Actor):
    """Serves the OpenAI-compatible HTTP API, SGLang's native routes and the admin routes."""

    name = "frontdoor"
    on_request_path = True

    async def start(self) -> None:
        cfg = self.config
        self.pipeline = RequestPipeline(
            self.bus, self.subjects, self.instance_id, cfg.requests.request_timeout_s, cfg.requests.max_migrations
        )
        await self.pipeline.start()
        self.spawn(self.pipeline.watch_liveness(), "watch_liveness")
        tenants = Tenants.from_config(cfg.tenancy.api_keys, cfg.tenancy.admin_key)
        engine = cfg.engine
        facts = ServerFacts(
            engine.model_name,
            engine.model or engine.model_name,
            engine.block_size,
            engine.max_num_seqs,
            engine.max_prefill_tokens,
            engine.max_model_len,
            engine.deterministic,
        )
        app = HttpApi(
            self.pipeline,
            self.bus,
            self.subjects,
            tenants,
            facts,
            cfg.http.max_body_bytes,
            cfg.http.max_concurrent_requests,
            cfg.http.incremental_streaming_output,
            ChatFormat.of_config(cfg),
            engine.embedding_pooling,
        ).build_app()
        # Cancel a handler when its client disconnects, so a dropped request is aborted at once.
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, cfg.http.host, cfg.http.port, reuse_address=True, backlog=LISTEN_BACKLOG)
        await site.start()
        self.log.info("http_listening", url=f"http://{cfg.http.host}:{cfg.http.port}")

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.pipeline.close()
