"""Updates from tensors a trainer shares (SGLang's serialized_named_tensors): the restricted
unpickler admits torch's tensor rebuilds (CPU shared memory here; CUDA IPC in the `gpu` test, with
a real trainer process) and refuses, by name, a pickle of anything else; the tensors land in the
live weights, and a NaN or a wrong name rolls back."""

import io
import os
import pickle
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from gpu.ipc_tensors import FlattenedTensorMetadata, ipc_payload, open_payload
from gpu.weight_check import WeightError
from ops.rl.weight_push import checkpoint_tensors
from tests.devices import needs_cuda
from tests.gpu.weight_models import logits, same_weights, served, weights_of
from tests.gpu.weight_trainer import REPO

CPU = torch.device("cpu")


@pytest.mark.parametrize("flattened", [False, True], ids=["pairs", "flattened"])
def test_shared_tensors_become_the_live_weights(llama, llama_next, flattened):
    runner, receiver = served(llama)
    named = checkpoint_tensors(llama_next)
    half = len(named) // 2
    payloads = [ipc_payload(named[:half], flattened), ipc_payload(named[half:], flattened)]
    report = receiver.apply_ipc(payloads, flattened, full=True)
    assert torch.equal(logits(runner), logits(served(llama_next)[0]))
    assert (report.tensors, report.bytes) == (len(named), sum(t.numel() * 4 for _, t in named))


def test_a_nan_or_a_wrong_name_leaves_the_old_weights(llama, llama_next):
    runner, receiver = served(llama)
    weights = weights_of(runner)
    named = checkpoint_tensors(llama_next)
    named[-1][1].view(-1)[5] = float("inf")
    with pytest.raises(
        WeightError, match=f"^{named[-1][0]} has NaN or infinite values; nothing was written: the old weights serve on"
    ):
        receiver.apply_ipc([ipc_payload(named, True)], True)
    with pytest.raises(WeightError, match="^model.layers.2.mlp.up_proj.weight is not a weight of the served model"):
        receiver.apply_ipc([ipc_payload([("model.layers.2.mlp.up_proj.weight", torch.zeros(3))], False)], False)
    assert same_weights(weights_of(runner), weights)


class Payload:
    """Pickles as a call of `func(*args)`: what a hostile payload does."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


class Stranger:
    pass


def forking_pickle(obj) -> bytes:
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(obj)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "obj, message",
    [
        ([("w", Payload(os.system, "echo owned"))], r"names posix.system, which is no tensor rebuild"),
        ([("w", Stranger())], r"names tests.gpu.test_weight_ipc.Stranger, which is no tensor rebuild"),
        ([("w", Payload(torch.zeros, 10))], r"names builtins.getattr, which is no tensor rebuild"),
        ([("w", Payload(torch.Tensor, 10))], r"calls Tensor, no tensor rebuild"),
        ([("w", Payload(eval, "1"))], r"names builtins.eval"),
    ],
    ids=["os.system", "another-class", "torch.zeros", "a-tensor-class-called", "eval"],
)
def test_a_pickle_of_anything_else_is_refused_by_name(obj, message):
    with pytest.raises(WeightError, match=message):
        open_payload(forking_pickle(obj), False, CPU)


def test_payloads_of_the_wrong_form_are_refused():
    named = [("a", torch.ones(2, 3)), ("b", torch.zeros(4, dtype=torch.bfloat16))]
    with pytest.raises(WeightError, match="must be a list of \\(name, tensor\\) pairs"):
        open_payload(ipc_payload(named, True), False, CPU)
    with pytest.raises(WeightError, match="must hold a flattened_tensor of bytes"):
        open_payload(ipc_payload(named, False), True, CPU)
    with pytest.raises(WeightError, match="is not a pickle of shared tensors"):
        open_payload(ipc_payload(named, False)[:-7], False, CPU)
    bucket = torch.zeros(10, dtype=torch.uint8)
    lying = FlattenedTensorMetadata("a", torch.Size([2, 3]), torch.float32, 0, 10, 10)
    with pytest.raises(
        WeightError, match=r"a: its bytes \[0, 10\) are not within|a: 10 bytes in the bucket do not hold"
    ):
        open_payload(forking_pickle({"flattened_tensor": bucket, "metadata": [lying]}), True, CPU)
    cuda_rebuild = pickle.dumps(Payload(torch.multiprocessing.reductions.rebuild_cuda_tensor, 1))
    with pytest.raises(WeightError, match=r"rebuild_cuda_tensor, which is no tensor rebuild \(CUDA tensors on a CPU"):
        open_payload(cuda_rebuild, False, CPU)


def test_both_forms_open_to_the_tensors_sent():
    named = [("a", torch.randn(2, 3)), ("b", torch.randn(5).to(torch.bfloat16)), ("c", torch.randn(()))]
    for flattened in (False, True):
        opened = open_payload(ipc_payload(named, flattened), flattened, CPU)
        assert [spec.name for spec, _ in opened] == ["a", "b", "c"]
        for (spec, tensor), (_, sent) in zip(opened, named):
            assert spec.dtype == sent.dtype and spec.shape == tuple(sent.shape) and torch.equal(tensor, sent)


PRODUCER = """
import sys, torch
from gpu.ipc_tensors import ipc_payload
from ops.rl.weight_push import checkpoint_tensors
named = checkpoint_tensors(sys.argv[1], "cuda", torch.bfloat16)
sys.stdout.buffer.write(ipc_payload(named, sys.argv[2] == "flattened"))
sys.stdout.close()
sys.stdin.read()  # the tensors live until the server is done
"""


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("flattened", [False, True], ids=["pairs", "flattened"])
def test_cuda_ipc_from_a_trainer_process(llama, llama_next, flattened):
    runner, receiver = served(llama, "cuda")
    form = "flattened" if flattened else "pairs"
    trainer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, str(llama_next), form], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        payload = trainer.stdout.read()
        receiver.apply_ipc([payload], flattened, full=True)
    finally:
        trainer.stdin.close()
        trainer.wait(timeout=60)
    assert same_weights(weights_of(runner), weights_of(served(llama_next, "cuda")[0]))
