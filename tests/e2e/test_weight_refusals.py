"""Bad weight updates through a real server's HTTP routes, each answered with a clear 400 while the
old weights serve on: a trainer's broadcast described with a name the model lacks, or broadcasting
tensors of other shapes or another dtype (the server takes every broadcast, so the trainer ends,
and drops them); a pickle of something other than tensors (never run: its marker file is never
written); two updates at once. Afterwards the greedy tokens and the version are those of before.
The same on the bus: each request on `<ns>.admin.weights` answered with its typed reply, a bad one
with an `Error` naming what is wrong.

The server here is this module's own: a refusal that failed would change what others' servers answer."""

import asyncio
import base64
import datetime
import os
import pickle

import httpx
import msgspec
import pytest

from gpu.model_builder import build_model_dir
from ops.local_server import start_server
from schemas.admin_weights import (
    FinishBusUpload,
    GetWeightsByName,
    GetWeightVersion,
    UpdateFromDisk,
    UpdateFromDistributed,
    UpdateFromTensor,
    UpdateWeightVersion,
    WeightValues,
    WeightVersion,
)
from schemas.errors import Error
from schemas.sleep import GetMemory, MemoryState, ReleaseMemory, ResumeMemory
from tests.e2e.weights_client import ask
from tests.gpu.weight_trainer import Trainer

PROMPT = [12, 40, 7, 99, 31, 64, 5, 250]
GREEDY = {"temperature": 0, "ignore_eos": True}
UNKNOWN = "model.layers.99.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def refusing_server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("refusals"), "--num-kv-blocks", "256")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def served(refusing_server) -> tuple[list[int], str]:
    """The greedy tokens and the version every test must find unchanged after its refusal."""
    tokens = generate(refusing_server.base_url, 16)
    return tokens, httpx.get(f"{refusing_server.base_url}/get_weight_version").json()["weight_version"]


def generate(base_url: str, max_new_tokens: int) -> list[int]:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": max_new_tokens, **GREEDY}}
    response = httpx.post(f"{base_url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["output_ids"]


def assert_serving(base_url: str, served: tuple[list[int], str]) -> None:
    assert generate(base_url, 16) == served[0]
    assert httpx.get(f"{base_url}/get_weight_version").json() == {"weight_version": served[1]}


def refused(response: httpx.Response, *words: str) -> dict:
    body = response.json()
    assert response.status_code == 400, body
    assert body["success"] is False and all(word in body["message"] for word in words), body
    return body


def wrong_name(request: dict) -> dict:
    return request | {"names": request["names"][:-1] + [UNKNOWN]}


@pytest.mark.parametrize(
    "checkpoint, options, change, words",
    [
        (None, (), wrong_name, (UNKNOWN, "not a weight of the served model")),
        ("hd128", (), lambda r: r, ("has shape",)),
        (None, ("--dtype", "bfloat16"), lambda r: r, ("is bfloat16", "send it in the served dtype")),
    ],
    ids=["unknown-name", "other-shapes", "other-dtype"],
)
def test_a_broadcast_of_the_wrong_tensors_is_refused_and_the_trainer_ends(
    refusing_server, served, tmp_path, checkpoint, options, change, words
):
    url = refusing_server.base_url
    model_dir = build_model_dir(tmp_path / checkpoint, size=checkpoint) if checkpoint else refusing_server.model_dir
    trainer = Trainer(model_dir, "--flattened", *options)
    try:
        group = {"master_address": "127.0.0.1", "master_port": trainer.port, "rank_offset": 1, "world_size": 2}
        joined = httpx.post(f"{url}/init_weights_update_group", json=group | {"backend": "gloo"}, timeout=120)
        assert joined.status_code == 200 and joined.json()["success"] is True, joined.text
        request = change(trainer.request())
        update = httpx.post(f"{url}/update_weights_from_distributed", json=request, timeout=120)
        refused(update, *words)
        assert trainer.said() == "done"  # its broadcast was taken: the group stays in step
        assert httpx.post(f"{url}/destroy_weights_update_group", json={}).json()["success"] is True
    finally:
        trainer.close()
    assert_serving(url, served)


class Call:
    """Pickles as a call of `func(*args)`: what a hostile payload does when unpickled."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def test_a_pickle_of_anything_but_tensors_is_refused_unopened(refusing_server, served, tmp_path):
    url = refusing_server.base_url
    marker = tmp_path / "owned"
    for payload, named in (
        ([("model.norm.weight", Call(os.system, f"touch {marker}"))], "posix.system"),
        ([("model.norm.weight", datetime.date(2024, 1, 1))], "datetime.date"),
        (Call(os.system, f"touch {marker}"), "posix.system"),
    ):
        encoded = base64.b64encode(pickle.dumps(payload)).decode()
        response = httpx.post(f"{url}/update_weights_from_tensor", json={"serialized_named_tensors": [encoded]})
        refused(response, named)
        assert not marker.exists()
    assert_serving(url, served)


async def test_two_updates_at_once_the_second_is_refused(refusing_server, served):
    """The first waits in its broadcast (a trainer stopped after one tensor) while the second comes;
    the trainer then dies, and the first fails too: nothing changed."""
    trainer = Trainer(refusing_server.model_dir, "--pause-after", "1")
    group = {"master_address": "127.0.0.1", "master_port": trainer.port, "rank_offset": 1, "world_size": 2}
    disk = {"model_path": str(refusing_server.model_dir), "weight_version": "second"}
    try:
        async with httpx.AsyncClient(base_url=refusing_server.base_url, timeout=300) as http:
            joined = await http.post("/init_weights_update_group", json=group | {"backend": "gloo"})
            assert joined.status_code == 200, joined.text
            request = await asyncio.to_thread(trainer.request)
            first = asyncio.create_task(http.post("/update_weights_from_distributed", json=request))
            assert await asyncio.to_thread(trainer.said) == "paused"
            refused(await http.post("/update_weights_from_disk", json=disk), "one weight operation at a time")
            trainer.kill()
            refused(await first, "old weights serve on")
    finally:
        trainer.close()
    assert_serving(refusing_server.base_url, served)


# --- The same conversation on the bus (`<ns>.admin.weights`), as a remote trainer holds it ---------


@pytest.fixture
async def nc(refusing_server):
    connection = await refusing_server.connect_nats()
    yield connection
    await connection.drain()


async def test_every_bus_request_is_answered_with_its_typed_reply(nc, refusing_server, served):
    version = await ask(nc, GetWeightVersion())
    assert isinstance(version, WeightVersion) and version.weight_version == served[1], version
    try:
        renamed = await ask(nc, UpdateWeightVersion("renamed", abort_all_requests=False))
        assert isinstance(renamed, WeightVersion) and renamed.weight_version == "renamed", renamed
        assert (await ask(nc, GetWeightVersion())).weight_version == "renamed"
    finally:
        assert (await ask(nc, UpdateWeightVersion(served[1]))).weight_version == served[1]
    read = await ask(nc, GetWeightsByName("model.norm.weight", 4))
    assert isinstance(read, WeightValues) and len(read.values) == 4 and read.checksum, read
    memory = await ask(nc, GetMemory())
    assert isinstance(memory, MemoryState) and memory.released == [], memory
    try:
        assert "kv_cache" in (await ask(nc, ReleaseMemory(["kv_cache"]))).released
    finally:
        assert (await ask(nc, ResumeMemory(["kv_cache"]))).released == []
    assert_serving(refusing_server.base_url, served)


async def test_bad_bus_requests_get_error_replies_naming_what_is_wrong(nc, refusing_server, served):
    hostile = pickle.dumps([("model.norm.weight", Call(os.system, "true"))])
    for request, words, param in (
        (UpdateFromDisk(str(refusing_server.model_dir), load_format="gguf"), "load_format", "load_format"),
        (UpdateFromDistributed(["model.norm.weight"], [], [[64]]), "dtypes has 0 entries", "dtypes"),
        (UpdateFromDistributed(["model.norm.weight"], ["float32"], [[64]]), "is not joined", None),
        (UpdateFromTensor([hostile]), "posix.system", None),
        (GetWeightsByName(UNKNOWN), UNKNOWN, None),
        (FinishBusUpload("never-begun"), "never-begun", "upload_id"),
    ):
        error = await ask(nc, request)
        assert isinstance(error, Error) and words in error.message and error.param == param, (request, error)
    raw = await nc.request("llm.admin.weights", msgspec.msgpack.encode({"type": "resume_memory", "tags": ["gpu"]}))
    error = msgspec.msgpack.decode(raw.data, type=Error)
    assert error.code == "invalid_request" and "tags" in (error.param or ""), error
    assert_serving(refusing_server.base_url, served)
