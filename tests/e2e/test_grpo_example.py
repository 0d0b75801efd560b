"""The example trainer (ops/rl/grpo_example.py) against a real server on the CPU, over gloo: its
GRPO steps reach the server whole. After each push the next rollout's replies all carry the new
version, and the server's logprobs of the drawn tokens are the trainer's own on its new weights,
while the step moved those logprobs far more than that: weights that had not arrived would show."""

import httpx
import pytest

from gpu.model_builder import build_model_dir
from ops.local_server import start_server
from ops.rl.grpo_example import parse_args, train


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("grpo") / "tiny", size="tiny", seed=5)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    running = start_server(tmp_path_factory.mktemp("grpo-server"), "--num-kv-blocks", "256", model=str(model_dir))
    yield running
    running.stop()


def test_three_grpo_iterations_push_weights_the_server_then_computes_with(server, model_dir):
    args = ["--url", server.base_url, "--model-dir", str(model_dir), "--transport", "gloo"]
    iterations = train(parse_args([*args, "--iterations", "3", "--lr", "3e-3"]))

    assert [(i.rollout_version, i.pushed_version) for i in iterations] == [("default", "1"), ("1", "2"), ("2", "3")]
    assert httpx.get(f"{server.base_url}/get_weight_version").json() == {"weight_version": "3"}
    for before, after in zip(iterations, iterations[1:]):
        # `after` rolled out on the weights `before` pushed: the server computes what the trainer does.
        assert after.logprob_gap < 1e-3
        assert before.step_shift > 20 * after.logprob_gap, (before, after)
    assert iterations[0].logprob_gap < 1e-3  # and the trainer started from the served checkpoint
    assert all(i.loss == i.loss and 0 <= i.reward_mean <= 1 for i in iterations)
