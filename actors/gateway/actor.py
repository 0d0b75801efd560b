"""The gateway actor: the origin of the requests that other services send on `<ns>.generate`
(with API keys, `<ns>.generate.<tenant>`), and of their aborts, sent on the same subject.

It runs apart from the HTTP frontdoor, so a frontdoor crash leaves bus clients untouched, and a
bus outage costs them nothing: a client that missed chunks asks again and gets them replayed.
"""

from actors.gateway.bus_api import BusApi
from actors.lib.chat_format import ChatFormat
from actors.lib.origin.pipeline import RequestPipeline
from kernel.actor import Actor
from schemas.embed import PublicRequest

QUEUE_GROUP = "gateways"


class GatewayActor(Actor):
    """Serves the `generate` bus API to other services, resuming streams a bus outage cut."""

    name = "gateway"
    on_request_path = True

    async def start(self) -> None:
        cfg = self.config
        self.pipeline = RequestPipeline(
            self.bus, self.subjects, self.instance_id, cfg.requests.request_timeout_s, cfg.requests.max_migrations
        )
        await self.pipeline.start()
        self.spawn(self.pipeline.watch_liveness(), "watch_liveness")
        self.bus_api = BusApi(
            self.bus, self.pipeline, cfg.engine.model_name, cfg.engine.embedding_pooling, ChatFormat.of_config(cfg)
        )
        self.spawn(self.bus_api.forget_finished(), "forget_finished")
        if cfg.tenancy.api_keys is None:  # the network is trusted, as over HTTP: `user` names the tenant
            await self.bus.subscribe(self.subjects.generate, PublicRequest, self.bus_api.on_request, queue=QUEUE_GROUP)
        else:  # the tenant is the subject's last token, on which only that tenant may publish (kernel/bus_grants.py)
            await self.bus.subscribe_under(
                self.subjects.generate, PublicRequest, self.bus_api.on_request, queue=QUEUE_GROUP
            )

    async def stop(self) -> None:
        await self.bus_api.close()
        await self.pipeline.close()
