"""`python -m kernel.supervisor`: starts the bus and every actor, restarts what dies, and
shuts everything down in order on Ctrl-C or SIGTERM.

With no arguments it converts the default model into the data dir (once, kernel/model_source.py),
starts an embedded nats-server, and serves on http://127.0.0.1:8000.
"""

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import msgspec
import structlog
import uvloop

from actors.cache_tier.host_segment import remove_segments
from kernel import bus_auth, config_flags, tenants
from kernel.actor import START_REFUSED_EXIT_CODE
from kernel.bus import Bus
from kernel.children import ChildProcess, RestartBudget
from kernel.config import KernelConfig, SupervisionConfig
from kernel.liveness import Instance, Liveness
from kernel.log import configure
from kernel.model_source import ModelUnavailable, prepare_model
from kernel.nats_server import EmbeddedNats
from kernel.subjects import Subjects
from schemas.health import Heartbeat

# Start order; shutdown goes the other way, so the door closes before the engine stops.
# The snapshot actor comes before the scheduler, which restores its sessions from it, and stops after it.
ACTORS = ("executor", "cache_tier", "snapshot", "scheduler", "weight_sync", "tokenizer", "gateway", "frontdoor")
STOP_TIMEOUT_S = 10.0
LIVENESS_CHECK_S = 0.5

log = structlog.get_logger()


class GaveUp(Exception):
    """A child crashed more often than its restart budget allows."""


class Supervisor:
    def __init__(self, config: KernelConfig) -> None:
        self.config = config
        self.data_dir = Path(config.supervision.data_dir).resolve()
        self.nats: EmbeddedNats | None = None
        self.bus: Bus | None = None  # the heartbeats' connection
        self.children: dict[str, ChildProcess] = {}
        self.budgets: dict[str, RestartBudget] = {}
        self.stopping = False
        self._ready: set[str] = set()
        self._announced = False
        self.liveness = Liveness()

    async def run(self, stop_requested: asyncio.Event) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        model = await prepare_model(self.config.engine.model, self.data_dir)
        engine = msgspec.structs.replace(
            self.config.engine,
            model=str(model.path),
            served_model_name=self.config.engine.served_model_name or model.name,
        )
        self.config = msgspec.structs.replace(self.config, engine=engine)
        if self.config.bus.nats_url is None:
            tenancy = self.config.tenancy
            keys = tenants.read_api_keys(tenancy.api_keys) if tenancy.api_keys else None
            self.nats = EmbeddedNats(
                self.data_dir,
                config_file=bus_auth.prepare(
                    self.data_dir,
                    self.config.bus.namespace,
                    self.config.bus.bus_max_payload_bytes,
                    tenants=None if keys is None else set(keys.values()),
                    admin=tenancy.admin_key is not None,
                ),
            )
            await self.nats.start()
            self.config = msgspec.structs.replace(
                self.config,
                bus=msgspec.structs.replace(self.config.bus, nats_url=self.nats.url),
                supervision=self._local_sessions(),
            )
        own_credentials = self._credentials_file("supervisor")
        credentials = bus_auth.load_credentials(own_credentials) if own_credentials else None
        self.bus = bus = await Bus.connect(self.config.bus.nats_url, name="supervisor", credentials=credentials)
        await bus.subscribe(Subjects(self.config.bus.namespace).all_heartbeats, Heartbeat, self._on_heartbeat)
        bus.on_reconnect(self._after_bus_outage)
        try:
            async with asyncio.TaskGroup() as group:
                for name, actor in self._child_names():
                    child = self.children[name] = ChildProcess(name, actor, self._child_argv(actor))
                    await child.start()
                    group.create_task(self._watch(child))
                if self.nats:
                    group.create_task(self._watch_nats())
                group.create_task(self._kill_stuck_actors())
                group.create_task(self._stop_on(stop_requested))
        finally:
            await bus.close()

    def _local_sessions(self) -> SupervisionConfig:
        """Under the embedded server, `auto` keeps sessions in files: its children are handed its
        --nats-url, which in them would mean an external server's JetStream."""
        supervision = self.config.supervision
        if supervision.session_store != "auto":
            return supervision
        return msgspec.structs.replace(supervision, session_store="files")

    def _credentials_file(self, user: str) -> str | None:
        """Under the embedded server each actor connects as a user of its own; the credentials
        given for an external server, if any, serve every actor."""
        if self.nats:
            return str(bus_auth.credentials_path(self.data_dir, user))
        return self.config.bus.nats_credentials

    def _child_argv(self, actor: str) -> list[str]:
        # The path of the credentials goes on the command line, never the password: argv shows in `ps`.
        own = msgspec.structs.replace(self.config.bus, nats_credentials=self._credentials_file(actor))
        return config_flags.to_argv(msgspec.structs.replace(self.config, bus=own))

    def _child_names(self) -> list[tuple[str, str]]:
        """(name, actor) in start order; tokenizer replicas are tokenizer, tokenizer-2, ..."""
        names = []
        for actor in ACTORS:
            copies = self.config.supervision.tokenizers if actor == "tokenizer" else 1
            names += [(actor if i == 0 else f"{actor}-{i + 1}", actor) for i in range(copies)]
        return names

    async def _after_bus_outage(self) -> None:
        self.liveness.forgive_silence()  # silence while the bus was down is not a stuck actor

    async def _on_heartbeat(self, beat: Heartbeat, _reply_to: str | None) -> None:
        self.liveness.observe(beat)
        if beat.ready:
            self._ready.add(beat.actor)
        if not self._announced and self._ready >= set(ACTORS):
            self._announced = True
            url = f"http://{self.config.http.host}:{self.config.http.port}"
            log.info(
                "serving",
                url=url,
                model=self.config.engine.model_name,
                model_dir=self.config.engine.model,
                nats_url=self.config.bus.nats_url,
            )

    async def _watch(self, child: ChildProcess) -> None:
        while True:
            code = await child.wait()
            if self.stopping:
                return
            if code == START_REFUSED_EXIT_CODE:
                message = f"{child.name} cannot start with these settings: its start_refused event says why"
                log.critical("giving_up", child=child.name, message=message)
                raise GaveUp(message)
            log.error("child_exited", child=child.name, code=code, pid=child.pid)
            self._count_restart(child.name)
            await child.start()

    def _count_restart(self, name: str) -> None:
        """Counts a restart of `name` against its own budget, and raises GaveUp past it. Each child
        (an actor process, each tokenizer replica, the nats-server) has its own: one child in a
        crash loop ends the deployment, while occasional restarts of several do not add up to that."""
        limits = self.config.supervision
        budget = self.budgets.setdefault(name, RestartBudget(limits.max_restarts, limits.restart_period_s))
        if not budget.allow():
            message = (
                f"{name} crashed; more than {budget.max_restarts} restarts of it within "
                f"{budget.period_s:g} s, giving up"
            )
            log.critical("giving_up", child=name, message=message)
            raise GaveUp(message)

    async def _kill_stuck_actors(self) -> None:
        """A child whose process lives but whose heartbeats stopped is stuck (a deadlock, a hung
        device call, SIGSTOP), as is one whose beats say so (a hung step its loop outlives): kill
        it, so the watcher restarts it."""
        while not self.stopping:
            await asyncio.sleep(LIVENESS_CHECK_S)
            for instance in self.liveness.expire():
                self._kill(instance, "its heartbeats stopped")
            for instance in self.liveness.stuck():
                self._kill(instance, instance.stuck)

    def _kill(self, instance: Instance, reason: str) -> None:
        child = next((c for c in self.children.values() if c.pid == instance.pid), None)
        if child and child.process.returncode is None:
            log.error("actor_stuck", child=child.name, pid=child.pid, reason=reason)
            child.process.kill()

    async def _watch_nats(self) -> None:
        """The bus server restarts on the same port; the actors reconnect on their own."""
        while True:
            code = await self.nats.process.wait()
            if self.stopping:
                return
            log.error("nats_exited", code=code)
            self._count_restart("nats-server")
            await self.nats.start()

    async def _stop_on(self, stop_requested: asyncio.Event) -> None:
        await stop_requested.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        """Stops the actors front to back, then the bus server."""
        if self.stopping:
            return
        self.stopping = True
        log.info("shutting_down")
        for name, _ in reversed(self._child_names()):
            if name in self.children:
                await self.children[name].stop(STOP_TIMEOUT_S)
        if self.bus is not None:  # before its server goes, which it would otherwise take for an outage
            await self.bus.close()
        if self.nats:
            await self.nats.stop()
        # The host tier's memory outlives the processes that map it (so a restarted executor or
        # cache_tier finds it); with all of them stopped, nothing would read it again.
        if removed := remove_segments(str(self.data_dir)):
            log.info("host_segments_removed", segments=removed)
        log.info("stopped")


async def _main(config: KernelConfig) -> int:
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    supervisor = Supervisor(config)
    try:
        await supervisor.run(stop_requested)
    except ModelUnavailable as exc:
        print(f"supervisor: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:
        await supervisor.shutdown()
        gave_up, others = group.split(GaveUp)
        if others:
            raise others from None
        print(f"supervisor: {gave_up.exceptions[0]}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m kernel.supervisor",
        description="Serve a Hugging Face causal LM over HTTP (OpenAI-compatible) and NATS.",
    )
    config_flags.add_arguments(parser)
    config, _ = config_flags.parse(parser, argv)
    if config.engine.deterministic and config.engine.attention_backend != "auto":
        parser.error("--deterministic attends with its own batch-invariant kernels: leave --attention-backend at auto")
    if config.bus.nats_url and config.bus.nats_credentials:
        try:
            bus_auth.load_credentials(config.bus.nats_credentials)
        except bus_auth.CredentialsError as exc:
            parser.error(f"--nats-credentials: {exc}")
    if (disk_dir := config.engine.disk_kv_dir) and os.path.exists(disk_dir) and not os.path.isdir(disk_dir):
        parser.error(f"--disk-kv-dir {disk_dir}: exists and is not a directory")
    if config.tenancy.api_keys:
        try:
            tenants.read_api_keys(config.tenancy.api_keys)
        except tenants.KeysFileError as exc:
            parser.error(f"--api-keys: {exc}")
    configure("supervisor", config.logging.log_format, config.logging.log_level)
    sys.exit(uvloop.run(_main(config)))


if __name__ == "__main__":
    main()
