import pytest


@pytest.fixture(scope="session")
def build_tiny_model(tmp_path_factory):
    """Builds (once per session) a tiny random-weight model of an architecture; returns its dir."""
    from gpu.model_builder import build_model_dir

    root = tmp_path_factory.mktemp("tiny-models")
    built = {}

    def build(arch: str):
        if arch not in built:
            built[arch] = build_model_dir(root / arch, arch=arch, size="tiny", seed=3)
        return built[arch]

    return build
