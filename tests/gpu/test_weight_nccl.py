"""Updates over NCCL from a real trainer process on the other GPU: the weights it broadcasts (each
tensor, or one flattened bucket) serve; a trainer killed mid-broadcast costs the deadline (the
communicator is aborted), the old weights serve bit for bit, and the group can be joined again."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from gpu.weight_check import WeightError
from tests.gpu.test_weight_group import apply
from tests.gpu.weight_models import logits, same_weights, served, weights_of
from tests.gpu.weight_trainer import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]
ON_THE_OTHER_GPU = {"CUDA_VISIBLE_DEVICES": "1", "NCCL_NVLS_ENABLE": "0"}


def nccl_trainer(checkpoint, *options):
    return Trainer(
        checkpoint, "--backend", "nccl", "--device", "cuda", "--dtype", "bfloat16", *options, env=ON_THE_OTHER_GPU
    )


def join(receiver, trainer):
    receiver.join_group("127.0.0.1", trainer.port, 1, 2, "weight_update_group", "nccl", timeout_s=120)
    return trainer.request()


@pytest.mark.parametrize("flattened", [False, True], ids=["per-tensor", "flattened"])
def test_a_broadcast_from_the_other_gpu_serves(llama, llama_next, flattened):
    runner, receiver = served(llama, "cuda")
    trainer = nccl_trainer(llama_next, *(["--flattened"] if flattened else []))
    try:
        apply(receiver, join(receiver, trainer), full=True)
        assert trainer.said() == "done"
    finally:
        trainer.kill()
    expected = served(llama_next, "cuda")[0]
    assert same_weights(weights_of(runner), weights_of(expected))
    assert torch.equal(logits(runner), logits(expected))


def test_a_trainer_killed_mid_broadcast_costs_the_deadline(llama, llama_next):
    runner, receiver = served(llama, "cuda")
    before, weights = logits(runner), weights_of(runner)
    trainer = nccl_trainer(llama_next, "--pause-after", "5")
    try:
        request = join(receiver, trainer)
        with ThreadPoolExecutor(1) as pool:
            update = pool.submit(apply, receiver, request, 5.0)
            assert trainer.said() == "paused"
            trainer.kill()
            with pytest.raises(WeightError, match="nothing was written: the old weights serve on"):
                update.result(timeout=60)
    finally:
        trainer.kill()
    assert torch.equal(logits(runner), before) and same_weights(weights_of(runner), weights)

    trainer = nccl_trainer(llama_next, "--flattened")
    try:
        apply(receiver, join(receiver, trainer), full=True)
    finally:
        trainer.kill()
    assert same_weights(weights_of(runner), weights_of(served(llama_next, "cuda")[0]))
