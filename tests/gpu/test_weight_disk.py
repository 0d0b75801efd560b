"""Updates from a checkpoint directory: the served logits become the new checkpoint's exactly; a
checkpoint with a NaN, a wrong shape, a missing or unknown tensor, or cut short is refused by
name and the old weights keep serving bit for bit."""

import pytest
import torch

from gpu.ipc_tensors import ipc_payload
from gpu.safetensors_stream import read_header
from gpu.weight_check import WeightError, checksum
from tests.gpu.weight_models import edited, logits, other_weights, same_weights, served, weights_of


def test_a_disk_update_serves_the_new_checkpoint_exactly(llama, llama_next):
    runner, receiver = served(llama)
    before = logits(runner)
    report = receiver.apply_disk(llama_next)
    fresh, _ = served(llama_next)
    assert torch.equal(logits(runner), logits(fresh))
    assert not torch.equal(logits(runner), before)
    assert same_weights(weights_of(runner), weights_of(fresh))  # the packs too: parts are their views
    stored = read_header(llama_next / "model.safetensors")
    assert (report.tensors, report.bytes) == (len(stored), sum(t.end - t.begin for t in stored))


def test_a_tied_model_updates_its_head_with_its_embedding(build_tiny_model, tmp_path):
    tied = other_weights(build_tiny_model("qwen3"), tmp_path / "tied", seed=1, tie_word_embeddings=True)
    tied_next = other_weights(tied, tmp_path / "tied-next", seed=2)
    runner, receiver = served(tied)
    receiver.apply_disk(tied_next)
    assert runner.model.lm_head.weight is runner.model.model.embed_tokens.weight
    assert torch.equal(logits(runner), logits(served(tied_next)[0]))


def test_the_reading_is_the_served_tensor(llama):
    runner, receiver = served(llama)
    name = "model.layers.1.self_attn.k_proj.weight"
    live = runner.model.model.layers[1].self_attn.k_proj.weight
    reading = receiver.read(name, truncate_size=3)
    assert reading.shape == tuple(live.shape) and reading.dtype == "float32"
    assert reading.values == live[:3].reshape(-1).tolist()
    assert reading.checksum == checksum(live.clone())
    with pytest.raises(WeightError, match="model.layers.9.mlp.up_proj.weight is not a weight"):
        receiver.read("model.layers.9.mlp.up_proj.weight", 3)


def nan_in_last(tensors, order):
    tensors[order[-1]].view(-1)[-1] = float("nan")


def wrong_shape(tensors, order):
    tensors["model.layers.0.mlp.down_proj.weight"] = tensors["model.layers.0.mlp.down_proj.weight"][:, :-1].clone()


def missing(tensors, order):
    del tensors["model.layers.1.post_attention_layernorm.weight"]


def unknown(tensors, order):
    tensors["model.layers.7.mlp.up_proj.weight"] = torch.zeros(2, 2)


@pytest.mark.parametrize(
    "edit, message",
    [
        (nan_in_last, "has NaN or infinite values; the old weights are restored"),
        (wrong_shape, r"down_proj.weight has shape \[64, 127\], the served weight \[64, 128\]"),
        (missing, "a full update lacks model.layers.1.post_attention_layernorm.weight"),
        (unknown, "model.layers.7.mlp.up_proj.weight is not a weight of the served model"),
    ],
    ids=["nan-in-last-tensor", "wrong-shape", "missing", "unknown"],
)
def test_a_bad_checkpoint_leaves_the_old_weights_serving(llama, llama_next, tmp_path, edit, message):
    bad = edited(llama_next, tmp_path / "bad", edit)
    runner, receiver = served(llama)
    before, weights = logits(runner), weights_of(runner)
    with pytest.raises(WeightError, match=message):
        receiver.apply_disk(bad)
    assert torch.equal(logits(runner), before)
    assert same_weights(weights_of(runner), weights)


def test_the_nan_is_named(llama_next, tmp_path):
    bad = edited(llama_next, tmp_path / "bad", nan_in_last)
    last = read_header(bad / "model.safetensors")[-1].name
    _, receiver = served(llama_next)
    with pytest.raises(WeightError, match=f"^{last} has NaN"):
        receiver.apply_disk(bad)


def test_a_checkpoint_cut_short_or_absent_is_refused(llama, llama_next, tmp_path):
    bad = edited(llama_next, tmp_path / "cut", lambda tensors, order: None)
    file = bad / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])
    runner, receiver = served(llama)
    before = logits(runner)
    with pytest.raises(WeightError, match="cut short|corrupt"):
        receiver.apply_disk(bad)
    assert torch.equal(logits(runner), before)
    with pytest.raises(WeightError, match="has no model.safetensors"):
        receiver.apply_disk(tmp_path)


def test_a_failed_update_returns_to_the_last_committed_weights(llama, llama_next, tmp_path):
    """A disk update takes the host copy first when the weights changed since it was taken, so a
    failure restores the last committed weights, not those the copy held before."""
    runner, receiver = served(llama)
    receiver.apply_disk(llama_next)
    assert not receiver.host.current
    committed = logits(runner)
    with pytest.raises(WeightError):
        receiver.apply_disk(edited(llama, tmp_path / "bad", nan_in_last))
    assert torch.equal(logits(runner), committed)


def test_a_full_update_fills_dropped_weights(llama, llama_next):
    """Weights released with no host copy (an update follows a sleep) are filled by the update."""
    runner, receiver = served(llama)
    receiver.host.release()
    receiver.apply_disk(llama_next)
    assert torch.equal(logits(runner), logits(served(llama_next)[0]))


def test_a_partial_update_cannot_fill_dropped_weights(llama, llama_next):
    runner, receiver = served(llama)
    receiver.host.release()
    named = [("model.norm.weight", torch.ones(64))]
    with pytest.raises(WeightError, match="the weights were dropped: only a full update can fill them"):
        receiver.apply_ipc([ipc_payload(named, False)], False)
