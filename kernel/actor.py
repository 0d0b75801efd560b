"""What every actor shares: start-up from flags, a bus connection, heartbeats, owned tasks,
and a graceful stop on SIGTERM.

An actor subclass names itself, subscribes in `start`, and cleans up in `stop`. Once started, it
answers NATS's service discovery as service `name` (kernel/bus_service.py). Its background
tasks go through `spawn`, so an exception in one is never lost: it stops the actor with an
error, and the supervisor restarts it (let it crash).
"""

import argparse
import asyncio
import atexit
import gc
import importlib.metadata
import os
import signal
import sys
import uuid
from collections.abc import Coroutine
from typing import ClassVar

import structlog
import uvloop

from kernel import bus_auth, config_flags
from kernel.bus import Bus
from kernel.busy_poll import window_s_for
from kernel.config import KernelConfig
from kernel.log import configure
from kernel.subjects import Subjects
from schemas.health import Heartbeat

HEARTBEAT_INTERVAL_S = 1.0
START_REFUSED_EXIT_CODE = 78  # sysexits' EX_CONFIG: the supervisor does not restart the actor


class StartRefused(Exception):
    """The actor cannot serve with its settings (the message names the flag): starting it again
    would fail the same way, so its process exits with START_REFUSED_EXIT_CODE."""


def _service_version() -> str:
    """What NATS's service discovery reports: the installed package's version; a source tree run
    without installing it (a copy on a GPU host) reports a placeholder rather than failing."""
    try:
        return importlib.metadata.version("kernel-llm")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+source"


SERVICE_VERSION = _service_version()


class Actor:
    name: ClassVar[str]
    on_request_path: ClassVar[bool] = False  # polls the bus after request traffic (kernel.busy_poll)

    def __init__(self, config: KernelConfig, bus: Bus, args: argparse.Namespace) -> None:
        self.config = config
        self.bus = bus
        self.args = args
        self.subjects = Subjects(config.bus.namespace)
        self.instance_id = uuid.uuid4().hex[:12]
        self.log = structlog.get_logger().bind(instance=self.instance_id)
        self._tasks: set[asyncio.Task] = set()
        self._failure: asyncio.Future = asyncio.get_running_loop().create_future()

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Flags of this actor alone, beyond the shared configuration."""

    async def start(self) -> None:
        """Subscribe and start background work. Called once, after the bus is connected."""

    async def stop(self) -> None:
        """Release what the actor holds. Called once on shutdown."""

    @property
    def ready(self) -> bool:
        """Whether the actor can serve now (reported in heartbeats)."""
        return True

    @property
    def stuck(self) -> str | None:
        """Why the actor makes no progress though its event loop runs (a hung step), or None.
        Reported in its heartbeats: it is then not ready, and the supervisor restarts it."""
        return None

    @property
    def polls_bus(self) -> bool:
        """Whether this actor's loop polls after request traffic, once started."""
        return self.on_request_path

    def spawn(self, coro: Coroutine, name: str) -> asyncio.Task:
        """Runs `coro` as an owned task; if it fails, the actor stops with that failure."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        if not self._failure.done():
            self._failure.set_exception(task.exception())

    async def _heartbeat_loop(self) -> None:
        subject = self.subjects.heartbeat(self.name)
        while True:
            stuck = self.stuck
            ready = self.ready and stuck is None
            beat = Heartbeat(self.name, self.instance_id, os.getpid(), ready, HEARTBEAT_INTERVAL_S, stuck)
            await self.bus.publish(subject, beat)
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)

    async def run_until_stopped(self, stop_requested: asyncio.Event) -> None:
        await self.start()
        freeze_startup_objects()  # before the registration below awaits and lets the tasks `start` spawned run
        await self.bus.serve_as_service(
            self.name,
            SERVICE_VERSION,
            (type(self).__doc__ or self.name).strip().splitlines()[0],
            {"instance": self.instance_id, "pid": str(os.getpid()), "namespace": self.config.bus.namespace},
        )
        self.spawn(self._heartbeat_loop(), "heartbeat")
        window_s = window_s_for(self.config.bus.busy_poll_ms, self.config.engine.device) if self.polls_bus else 0.0
        if window_s > 0:
            self.spawn(self.bus.poll_after_traffic(window_s), "busy_poll")
        self.log.info("actor_started", pid=os.getpid(), busy_poll_ms=window_s * 1000)
        stopper = asyncio.ensure_future(stop_requested.wait())
        try:
            await asyncio.wait([stopper, self._failure], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.stop()
            gc.unfreeze()  # what start-up made is garbage like the rest once the actor stops
        if self._failure.done():
            raise self._failure.exception()


def freeze_startup_objects() -> None:
    """Moves every object alive now out of the garbage collector's reach. What start-up made (the
    modules of torch, transformers and the kernels' libraries, the model, its CUDA graphs) lives as
    long as the process, yet each full collection walked all of it: in the executor that stopped
    the event loop, and so the GPU, for many decode steps' time in the middle of a run. Frozen,
    a full collection walks only what serving allocated since; a frozen object that start-up made
    and a later change replaces is freed by its reference count alone, or after `gc.unfreeze()`.

    The freeze is the whole process's: one actor runs per process. At exit the objects are
    unfrozen, so the interpreter collects them: nanobind (in Triton) reports objects it still
    finds then as leaks."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # registered once, however often this runs
    atexit.register(gc.unfreeze)


def main(actor_class: type[Actor], argv: list[str] | None = None) -> None:
    """Entry point of `python -m actors.<name>`."""
    parser = argparse.ArgumentParser(
        prog=f"python -m actors.{actor_class.name}",
        description=(actor_class.__doc__ or "").strip().splitlines()[0],
    )
    config_flags.add_arguments(parser)
    actor_class.add_arguments(parser)
    config, args = config_flags.parse(parser, argv)
    if not config.bus.nats_url:
        parser.error("--nats-url is required when an actor runs on its own")
    try:
        credentials = bus_auth.load_credentials(config.bus.nats_credentials) if config.bus.nats_credentials else None
    except bus_auth.CredentialsError as exc:
        parser.error(f"--nats-credentials: {exc}")
    log = configure(actor_class.name, config.logging.log_format, config.logging.log_level)
    try:
        uvloop.run(_serve(actor_class, config, args, credentials))
    except StartRefused as refused:
        log.critical("start_refused", reason=str(refused))
        sys.exit(START_REFUSED_EXIT_CODE)
    except Exception:
        log.exception("actor_crashed")
        sys.exit(1)


async def _serve(
    actor_class: type[Actor],
    config: KernelConfig,
    args: argparse.Namespace,
    credentials: bus_auth.BusCredentials | None,
) -> None:
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    bus = await Bus.connect(config.bus.nats_url, name=actor_class.name, credentials=credentials)
    try:
        actor = actor_class(config, bus, args)
        await actor.run_until_stopped(stop_requested)
    finally:
        await bus.close()
    structlog.get_logger().info("actor_stopped")
