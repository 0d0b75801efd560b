import pytest

from kernel.nats_server import EmbeddedNats


@pytest.fixture
async def nats_url(tmp_path):
    """A real nats-server of the test's own, for code that talks over the bus (no fake bus)."""
    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    yield server.url
    await server.stop()
