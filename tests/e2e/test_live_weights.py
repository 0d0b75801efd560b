"""Live weights through a real server, over SGLang's routes: an update from disk changes what the
model generates and the version every reply, `/get_weight_version` and `/get_model_info` report;
going back to the first checkpoint gives back the first outputs (no KV computed under other
weights is served); a request running through an update shows where the weights changed, exactly;
a bad update changes nothing; the version can be renamed; a weight reads back as it is on disk.

The server here is this module's own: the updates would change what other modules' servers answer."""

import asyncio
import json

import httpx
import pytest
import torch
from safetensors import safe_open

from gpu.model_builder import build_model_dir
from ops.local_server import start_server

PROMPT = [12, 40, 7, 99, 31, 64, 5, 250]
GREEDY = {"temperature": 0, "ignore_eos": True}
READ_NAME = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def weights_server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("weights"), "--num-kv-blocks", "256")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory, weights_server):
    """The served architecture with other weights (another seed)."""
    return build_model_dir(tmp_path_factory.mktemp("other") / "demo-seed1", seed=1)


def generate(base_url: str, input_ids: list[int], max_new_tokens: int) -> dict:
    body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens, **GREEDY}}
    response = httpx.post(f"{base_url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def update_from_disk(base_url: str, **body) -> httpx.Response:
    return httpx.post(f"{base_url}/update_weights_from_disk", json=body, timeout=300)


def test_every_door_says_which_weights_computed_the_tokens(weights_server):
    url = weights_server.base_url
    meta = generate(url, PROMPT, 6)["meta_info"]
    assert meta["weight_version"] == "default" and meta["version_spans"] == [[0, "default"]]
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 6}]
    body = {"model": "demo", "prompt": "hello", "max_tokens": 6, "temperature": 0}
    (choice,) = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"]
    assert choice["weight_version"] == "default" and choice["version_spans"] == [[0, "default"]]
    with httpx.stream("POST", f"{url}/v1/completions", json=body | {"stream": True}, timeout=60) as stream:
        chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]
    assert chunks and all(chunk["choices"][0]["weight_version"] == "default" for chunk in chunks)
    assert httpx.get(f"{url}/get_weight_version").json() == {"weight_version": "default"}
    assert httpx.get(f"{url}/get_model_info").json()["weight_version"] == "default"


def test_an_update_from_disk_changes_outputs_versions_and_model_path(weights_server, other_checkpoint):
    url = weights_server.base_url
    first = generate(url, PROMPT, 24)
    assert first["meta_info"]["weight_version"] == "default"
    assert httpx.get(f"{url}/get_weight_version").json() == {"weight_version": "default"}

    response = update_from_disk(url, model_path=str(other_checkpoint), weight_version="step-1")
    assert response.status_code == 200, response.text
    updated = response.json()
    assert updated["success"] is True and updated["num_paused_requests"] == 0 and updated["weight_version"] == "step-1"
    assert updated["tensors"] > 0 and updated["bytes"] > 0
    assert httpx.get(f"{url}/get_weight_version").json() == {"weight_version": "step-1"}
    info = httpx.get(f"{url}/get_model_info").json()
    assert info["weight_version"] == "step-1" and info["model_path"] == str(other_checkpoint)
    assert httpx.get(f"{url}/server_info").json()["weight_version"] == "step-1"
    other = generate(url, PROMPT, 24)
    assert other["output_ids"] != first["output_ids"]
    assert other["meta_info"]["weight_version"] == "step-1"
    assert other["meta_info"]["weight_versions"] == [{"version": "step-1", "start": 0, "end": 24}]
    completion = httpx.post(f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=60).json()
    assert completion["choices"][0]["weight_version"] == "step-1"

    # Back to the first checkpoint, naming no version: the count of updates since start.
    back = update_from_disk(url, model_path=str(weights_server.model_dir))
    assert back.status_code == 200 and back.json()["weight_version"] == "2"
    again = generate(url, PROMPT, 24)
    assert again["output_ids"] == first["output_ids"]  # the prompt's KV was computed again, not reused
    assert again["meta_info"]["version_spans"] == [[0, "2"]]


def test_a_bad_update_changes_nothing(weights_server, tmp_path):
    url = weights_server.base_url
    version = httpx.get(f"{url}/get_weight_version").json()["weight_version"]
    before = generate(url, PROMPT, 16)
    wrong_shapes = build_model_dir(tmp_path / "hd128", size="hd128")
    for model_path in (str(tmp_path / "nowhere"), str(wrong_shapes)):
        response = update_from_disk(url, model_path=model_path, weight_version="never")
        assert response.status_code == 400, response.text
        failure = response.json()
        assert failure["success"] is False and failure["message"] and failure["error"]["message"]
    assert httpx.get(f"{url}/get_weight_version").json() == {"weight_version": version}
    assert generate(url, PROMPT, 16)["output_ids"] == before["output_ids"]
    singular = httpx.post(
        f"{url}/update_weights_from_distributed", json={"name": "lm_head.weight", "dtype": "float32", "shape": [2, 2]}
    )
    assert singular.status_code == 400 and singular.json()["error"]["param"] == "name"


async def test_a_retracted_request_goes_on_under_the_new_weights_exactly(weights_server, other_checkpoint):
    """Retract mode: the KV of the tokens drawn so far is computed again under the new weights, so
    the tokens from the update on are what the new weights draw after prompt + the tokens before."""
    url = weights_server.base_url
    assert update_from_disk(url, model_path=str(weights_server.model_dir), weight_version="old").status_code == 200
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 300, **GREEDY}, "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        started = asyncio.Event()
        stream = asyncio.create_task(last_event(http, body, started))
        await asyncio.wait_for(started.wait(), 60)
        update = await http.post(
            "/update_weights_from_disk",
            json={"model_path": str(other_checkpoint), "weight_version": "new", "pause_mode": "retract"},
        )
        assert update.status_code == 200, update.text
        assert update.json()["num_paused_requests"] == 1
        end = await stream
    meta, tokens = end["meta_info"], end["output_ids"]
    assert meta["finish_reason"]["type"] == "length" and len(tokens) == 300
    ((_, old), (changed_at, new)) = meta["version_spans"]
    assert (old, new) == ("old", "new") and 0 < changed_at < 300
    assert meta["weight_versions"] == [
        {"version": "old", "start": 0, "end": changed_at},
        {"version": "new", "start": changed_at, "end": 300},
    ]
    after = generate(url, PROMPT + tokens[:changed_at], 300 - changed_at)
    assert after["output_ids"] == tokens[changed_at:]
    assert update_from_disk(url, model_path=str(weights_server.model_dir), weight_version="old").status_code == 200
    assert generate(url, PROMPT, changed_at)["output_ids"] == tokens[:changed_at]


def test_the_version_renamed_and_a_weight_read_back(weights_server, other_checkpoint):
    url = weights_server.base_url
    renamed = httpx.post(f"{url}/update_weight_version", json={"new_version": "renamed"})
    assert renamed.status_code == 200 and renamed.json()["new_version"] == "renamed"
    assert generate(url, PROMPT, 4)["meta_info"]["weight_version"] == "renamed"

    assert update_from_disk(url, model_path=str(other_checkpoint)).status_code == 200
    read = httpx.post(f"{url}/get_weights_by_name", json={"name": READ_NAME, "truncate_size": 2})
    assert read.status_code == 200, read.text
    with safe_open(str(other_checkpoint / "model.safetensors"), "pt") as checkpoint:
        on_disk = checkpoint.get_tensor(READ_NAME)[:2]
    torch.testing.assert_close(torch.tensor(read.json()), on_disk.float())
    assert read.headers["X-Weight-Shape"] == ",".join(map(str, checkpoint_shape(other_checkpoint)))
    assert read.headers["X-Weight-Checksum"]
    unknown = httpx.post(f"{url}/get_weights_by_name", json={"name": "model.layers.99.mlp.up_proj.weight"})
    assert unknown.status_code in (400, 404)


def checkpoint_shape(path) -> list[int]:
    with safe_open(str(path / "model.safetensors"), "pt") as checkpoint:
        return checkpoint.get_slice(READ_NAME).get_shape()


async def last_event(http: httpx.AsyncClient, body: dict, started: asyncio.Event) -> dict:
    last = None
    async with http.stream("POST", "/generate", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                last = json.loads(line.removeprefix("data: "))
                if len(last["output_ids"]) >= 4:
                    started.set()
    return last
