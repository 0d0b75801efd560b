"""The live-weight and memory routes answer a bad request themselves, through a real HTTP server,
before anything is asked of the bus (the routes here have none: a request that reached it would
be a 500): SGLang's failure fields, the error naming the field, status 400."""

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from actors.frontdoor.http_errors import errors_as_json
from actors.frontdoor.memory_routes import MemoryRoutes
from actors.frontdoor.weight_routes import WeightRoutes, sglang_values
from kernel.subjects import Subjects
from schemas.admin_weights import WeightValues


@pytest.fixture
async def http():
    app = web.Application(middlewares=[errors_as_json])
    for routes in (WeightRoutes(None, Subjects()), MemoryRoutes(None, Subjects())):
        routes.add_to(app.router)
    async with TestClient(TestServer(app)) as client:
        yield client


async def refused(response, param: str, words: str = "") -> dict:
    body = await response.json()
    assert response.status == 400, body
    assert body["error"]["param"] == param and words in body["error"]["message"], body
    return body


@pytest.mark.parametrize(
    "path, json, param, words",
    [
        ("/update_weights_from_disk", {}, "model_path", "required"),
        ("/update_weights_from_disk", {"model_path": "/c", "is_async": True}, "is_async", ""),
        ("/update_weights_from_disk", {"model_path": "/c", "abort_all_request": True}, "abort_all_request", "no such"),
        (
            "/update_weights_from_distributed",
            {"name": "lm_head.weight", "dtype": "bfloat16", "shape": [4, 4]},
            "name",
            "old single-tensor form",
        ),
        ("/update_weights_from_distributed", {"names": ["a"], "dtypes": [], "shapes": [[1]]}, "dtypes", ""),
        ("/update_weights_from_tensor", {"serialized_named_tensors": ["%%"]}, "serialized_named_tensors[0]", ""),
        (
            "/init_weights_update_group",
            {"master_address": "h", "master_port": "x", "rank_offset": 1, "world_size": 2},
            "master_port",
            "",
        ),
        ("/destroy_weights_update_group", {"group": "g"}, "group", ""),
        ("/update_weight_version", {"version": "2"}, "version", ""),
    ],
)
async def test_a_bad_update_body_gets_sglangs_failure_fields_and_the_field(http, path, json, param, words):
    body = await refused(await http.post(path, json=json), param, words)
    assert body["success"] is False and body["message"] == body["error"]["message"]
    assert body["num_paused_requests"] == 0


async def test_not_json_is_a_400(http):
    response = await http.post("/update_weights_from_disk", data=b"{model_path")
    body = await response.json()
    assert response.status == 400 and "not valid JSON" in body["message"]


async def test_bad_reads_and_memory_calls_name_the_field(http):
    await refused(await http.post("/get_weights_by_name", json={"name": "x", "truncate_size": 0}), "truncate_size")
    await refused(await http.get("/get_weights_by_name", params={"truncate_size": "5"}), "name")
    await refused(await http.get("/get_weights_by_name", params={"name": "x", "truncate_size": "-1"}), "truncate_size")
    await refused(await http.post("/release_memory_occupation", json={"tags": ["gpu"]}), "tags[0]")
    await refused(await http.post("/resume_memory_occupation", json={"tag": ["weights"]}), "tag")
    await refused(await http.post("/sleep", params={"level": "3"}), "level")
    await refused(await http.post("/wake_up", params=[("tags", "weights"), ("tags", "gpu")]), "tags", "gpu")


async def test_methods_are_sglangs_and_vllms(http):
    """SGLang serves flush and the memory routes on GET and POST, its updates on POST alone."""
    assert (await http.get("/update_weights_from_disk")).status == 405
    assert (await http.get("/sleep")).status == 405
    assert (await http.post("/get_weight_version")).status == 405


def test_weights_read_back_in_sglangs_shape():
    """SGLang answers `parameter[:truncate_size]`: rows of a matrix, the values of a vector."""
    matrix = WeightValues("w", [3, 2], "bfloat16", [1.0, 2.0, 3.0, 4.0], "c")
    assert sglang_values(matrix) == [[1.0, 2.0], [3.0, 4.0]]
    assert sglang_values(WeightValues("n", [4], "float32", [1.0, 2.0], "c")) == [1.0, 2.0]
