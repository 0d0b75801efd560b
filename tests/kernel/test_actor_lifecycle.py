"""Once an actor has started, what its start-up made is out of the garbage collector's reach (a full
collection walked all of it, pausing the executor's loop and the GPU for about 200 ms mid-run on the
H100 host); what it allocates while serving is collected as usual, and stopping gives the start-up
objects back for the interpreter's exit."""

import argparse
import asyncio
import gc
import weakref

from kernel.actor import Actor
from kernel.bus import Bus
from kernel.config import BusConfig, KernelConfig
from kernel.nats_server import EmbeddedNats


class Cycle:
    """An object in a reference cycle: only the garbage collector frees it."""

    def __init__(self) -> None:
        self.itself = self


class Probe(Actor):
    name = "probe"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.served = asyncio.Event()

    async def start(self) -> None:
        self.made_at_start = Cycle()  # stands for the model, the modules and the graphs
        self.spawn(self._serve(), "serve")

    async def _serve(self) -> None:
        # gc.get_objects() lists what a collection walks; frozen objects are not in it.
        self.start_up_object_walked = any(o is self.made_at_start for o in gc.get_objects())
        garbage = Cycle()
        self.garbage_made_while_serving = weakref.ref(garbage)
        del garbage
        gc.collect()
        self.served.set()


async def test_start_up_objects_are_frozen_while_serving_and_given_back_on_stop(tmp_path):
    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    bus = await Bus.connect(server.url, "probe")
    gc.unfreeze()
    try:
        probe = Probe(KernelConfig(bus=BusConfig(nats_url=server.url)), bus, argparse.Namespace())
        stop = asyncio.Event()
        running = asyncio.create_task(probe.run_until_stopped(stop))
        await asyncio.wait_for(probe.served.wait(), 10)
        assert not probe.start_up_object_walked
        assert probe.garbage_made_while_serving() is None  # collected as usual
        stop.set()
        await asyncio.wait_for(running, 10)
        assert gc.get_freeze_count() == 0
        assert any(o is probe.made_at_start for o in gc.get_objects())
    finally:
        gc.unfreeze()
        await bus.close()
        await server.stop()
