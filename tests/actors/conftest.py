import pytest
import torch

from kernel.nats_server import EmbeddedNats

# The models here are tiny: one thread computes a step as fast as several, and several spin
# against each other (and against anything else on the machine), which slows the suite tenfold.
torch.set_num_threads(1)


@pytest.fixture
async def nats_url(tmp_path):
    """A real nats-server of the test's own, for code that talks over the bus (no fake bus)."""
    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    yield server.url
    await server.stop()
