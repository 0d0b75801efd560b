"""Updates broadcast by a real trainer process over a gloo weight group (ops/rl/weight_push.py as
rank 0): each tensor or one flattened bucket lands in the live weights; a refused update still
takes every broadcast so the group stays in step; a trainer killed or hung mid-broadcast costs
the deadline, leaves the old weights serving bit for bit, and the next join works."""

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from gpu.weight_check import WeightError
from tests.gpu.weight_models import edited, logits, same_weights, served, weights_of
from tests.gpu.weight_trainer import Trainer


@pytest.fixture
def trainers():
    started: list[Trainer] = []

    def start(checkpoint, *options):
        started.append(Trainer(checkpoint, *options))
        return started[-1]

    yield start
    for trainer in started:
        trainer.kill()


def join(receiver, trainer, group_name="weight_update_group"):
    receiver.join_group("127.0.0.1", trainer.port, 1, 2, group_name, "gloo", timeout_s=60)
    return trainer.request()


def apply(receiver, request, deadline_s=60.0, group_name="weight_update_group", full=False):
    return receiver.apply_group(
        group_name,
        request["names"],
        request["dtypes"],
        request["shapes"],
        request["load_format"] == "flattened_bucket",
        request["checksums"],
        deadline_s,
        full=full,
    )


@pytest.mark.parametrize("flattened", [False, True], ids=["per-tensor", "flattened"])
def test_a_broadcast_update_serves_the_trainers_weights(llama, llama_next, trainers, flattened):
    runner, receiver = served(llama)
    trainer = trainers(llama_next, *(["--flattened"] if flattened else []))
    request = join(receiver, trainer)
    report = apply(receiver, request, full=True)
    assert trainer.said() == "done"
    assert torch.equal(logits(runner), logits(served(llama_next)[0]))
    assert report.tensors == len(request["names"])
    assert report.bytes == sum(math.prod(shape) * 4 for shape in request["shapes"])
    trainer.close()


def nan_in_last(tensors, order):
    tensors[order[-1]].view(-1)[0] = float("nan")


@pytest.mark.parametrize("flattened", [False, True], ids=["per-tensor", "flattened"])
def test_a_nan_or_a_bad_checksum_is_refused_and_the_group_stays_usable(
    llama, llama_next, trainers, tmp_path, flattened
):
    runner, receiver = served(llama)
    before, weights = logits(runner), weights_of(runner)
    options = ["--flattened"] if flattened else []
    trainer = trainers(edited(llama_next, tmp_path / "nan", nan_in_last), *options)
    request = join(receiver, trainer)
    with pytest.raises(WeightError, match=f"^{request['names'][-1]} has NaN or infinite values; nothing was written"):
        apply(receiver, request)
    assert trainer.said() == "done"
    assert torch.equal(logits(runner), before) and same_weights(weights_of(runner), weights)
    trainer.close()

    trainer = trainers(llama_next, *options)
    request = join(receiver, trainer)
    request["checksums"][3] = "0" * 16
    with pytest.raises(WeightError, match=f"^{request['names'][3]} arrived with checksum [0-9a-f]{{16}}, the trainer"):
        apply(receiver, request)
    assert same_weights(weights_of(runner), weights)


def narrower_down_proj(tensors, order):
    tensors["model.layers.0.mlp.down_proj.weight"] = tensors["model.layers.0.mlp.down_proj.weight"][:, :-1].clone()


def test_a_refused_update_still_takes_every_broadcast(llama, llama_next, trainers, tmp_path):
    runner, receiver = served(llama)
    weights = weights_of(runner)
    trainer = trainers(edited(llama_next, tmp_path / "narrow", narrower_down_proj))
    request = join(receiver, trainer)
    with pytest.raises(WeightError, match=r"^model.layers.0.mlp.down_proj.weight has shape \[64, 127\]"):
        apply(receiver, request)
    assert trainer.said() == "done"  # its broadcasts all ended
    assert same_weights(weights_of(runner), weights)
    trainer.close()

    trainer = trainers(llama_next, "--flattened")
    apply(receiver, join(receiver, trainer))  # the same group name, joined again
    assert torch.equal(logits(runner), logits(served(llama_next)[0]))


def test_bad_requests_are_refused_by_field(llama, trainers, llama_next):
    _, receiver = served(llama)
    with pytest.raises(WeightError, match="weight group nowhere is not joined"):
        receiver.apply_group("nowhere", [], [], [], False, [], 1.0)
    trainer = trainers(llama_next)
    request = join(receiver, trainer)
    with pytest.raises(WeightError, match="names, dtypes and shapes must be as long: 2, 1, 2"):
        receiver.apply_group("weight_update_group", ["a", "b"], ["float32"], [[1], [1]], False, [], 1.0)
    with pytest.raises(WeightError, match="'float33' is not a torch dtype"):
        receiver.apply_group("weight_update_group", ["a"], ["float33"], [[1]], False, [], 1.0)
    with pytest.raises(WeightError, match="checksums must be one per name or none"):
        receiver.apply_group("weight_update_group", ["a"], ["float32"], [[1]], False, ["x", "y"], 1.0)
    apply(receiver, request)  # refusals before any broadcast leave the group in step


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_trainer_lost_mid_broadcast_costs_the_deadline_and_the_next_join_works(llama, llama_next, trainers, how):
    runner, receiver = served(llama)
    before, weights = logits(runner), weights_of(runner)
    trainer = trainers(llama_next, "--pause-after", "5")
    request = join(receiver, trainer)
    with ThreadPoolExecutor(1) as pool:
        update = pool.submit(apply, receiver, request, 3.0)
        assert trainer.said() == "paused"
        trainer.kill() if how == "killed" else trainer.hang()
        with pytest.raises(WeightError, match="nothing was written: the old weights serve on"):
            update.result(timeout=30)
    assert torch.equal(logits(runner), before) and same_weights(weights_of(runner), weights)
    with pytest.raises(WeightError, match="weight group weight_update_group is not joined"):
        apply(receiver, request)

    trainer = trainers(llama_next, "--flattened")
    request = join(receiver, trainer)
    apply(receiver, request, full=True)
    assert torch.equal(logits(runner), logits(served(llama_next)[0]))
