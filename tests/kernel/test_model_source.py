"""`--model demo` builds the random demo model into the data dir on the first start, and later starts
on that data dir reuse it without running the builder (the end-to-end tests' servers start on a
copy placed there by ops/local_server.py, so this is where the build itself is tested)."""

from structlog.testing import capture_logs
from transformers import AutoConfig

from gpu.model_dir import is_complete
from kernel.model_source import DEMO_MODEL, PreparedModel, prepare_model


async def test_the_demo_model_is_built_on_the_first_start_and_reused_after(tmp_path):
    with capture_logs() as logs:
        first = await prepare_model(DEMO_MODEL, tmp_path)
        again = await prepare_model(DEMO_MODEL, tmp_path)
    assert first == again == PreparedModel(tmp_path / "models" / DEMO_MODEL, DEMO_MODEL)
    assert is_complete(first.path)
    assert AutoConfig.from_pretrained(first.path).model_type == "llama"
    assert [e["event"] for e in logs if e["event"] == "model_building"] == ["model_building"]
