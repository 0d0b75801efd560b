"""SGLang's live-weight bodies, as slime and AReaL send them, become the weight_sync actor's
messages with SGLang's defaults; anything else is a 400 naming the field."""

import base64
import json

import pytest

from actors.frontdoor import weight_bodies as bodies
from schemas.admin_weights import (
    DestroyWeightGroup,
    GetWeightsByName,
    InitWeightGroup,
    UpdateFromDisk,
    UpdateFromDistributed,
    UpdateFromTensor,
    UpdateWeightVersion,
)
from schemas.errors import Error
from schemas.sleep import ReleaseMemory, ResumeMemory


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def assert_invalid(result, param: str, words: str = "") -> None:
    assert isinstance(result, Error), result
    assert (result.code, result.http_status, result.param) == ("invalid_request", 400, param), result
    assert words in result.message, result.message


def test_disk_bodies_of_slime_and_areal_take_sglangs_defaults():
    assert bodies.parse_disk(body(model_path="/ckpt/7", weight_version="7")) == UpdateFromDisk(
        "/ckpt/7", weight_version="7"
    )
    areal = bodies.parse_disk(body(model_path="/ckpt", abort_all_requests=True))
    assert areal == UpdateFromDisk("/ckpt", abort_all_requests=True, flush_cache=True, pause_mode=None)
    full = bodies.parse_disk(
        body(
            model_path="/ckpt",
            load_format="auto",
            flush_cache=False,
            pause_mode="in_place",
            torch_empty_cache=True,
            recapture_cuda_graph=True,
            token_step=3,
            is_async=False,
            keep_pause=False,
            manifest=None,
        )
    )
    assert full == UpdateFromDisk("/ckpt", "auto", None, False, False, "in_place")


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({}, "model_path", "required"),
        ({"model_path": ""}, "model_path", ""),
        ({"model_path": "/c", "abort_all_request": True}, "abort_all_request", "no such field"),
        ({"model_path": "/c", "is_async": True}, "is_async", "before the server answers"),
        ({"model_path": "/c", "keep_pause": True}, "keep_pause", "/pause_generation"),
        ({"model_path": "/c", "manifest": {"a": 1}}, "manifest", "whole checkpoint"),
        ({"model_path": "/c", "pause_mode": "sideways"}, "pause_mode", ""),
        ({"model_path": "/c", "weight_version": 3}, "weight_version", "str"),
    ],
)
def test_disk_bodies_refused_name_the_field(fields, param, words):
    assert_invalid(bodies.parse_disk(body(**fields)), param, words)


def test_distributed_body_as_slime_sends_it():
    slime = body(
        names=["model.norm.weight", "lm_head.weight"],
        dtypes=["bfloat16", "bfloat16"],
        shapes=[[256], [2048, 256]],
        group_name="slime-pp_0",
        flush_cache=False,
        weight_version="4",
    )
    assert bodies.parse_distributed(slime) == UpdateFromDistributed(
        ["model.norm.weight", "lm_head.weight"],
        ["bfloat16", "bfloat16"],
        [[256], [2048, 256]],
        group_name="slime-pp_0",
        weight_version="4",
        flush_cache=False,
    )
    areal = bodies.parse_distributed(body(names=["a"], dtypes=["float32"], shapes=[[2]], abort_all_requests=True))
    assert areal.group_name == "weight_update_group" and areal.abort_all_requests and areal.checksums == []
    with_sums = bodies.parse_distributed(
        body(names=["a"], dtypes=["float32"], shapes=[[2]], checksums=["c1"], load_format="flattened_bucket")
    )
    assert with_sums.checksums == ["c1"] and with_sums.load_format == "flattened_bucket"


@pytest.mark.parametrize("old", ["name", "dtype", "shape"])
def test_the_old_singular_body_is_a_400_naming_the_field(old):
    singular = {"name": "lm_head.weight", "dtype": "bfloat16", "shape": [2048, 256]}
    first = {old: singular.pop(old)} | singular  # whichever of them comes first is named
    result = bodies.parse_distributed(body(**first))
    assert_invalid(result, old, "old single-tensor form")
    assert "`names`, `dtypes`, `shapes`" in result.message


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"names": [], "dtypes": [], "shapes": []}, "names"),
        ({"names": ["a", "b"], "dtypes": ["bfloat16"], "shapes": [[1], [1]]}, "dtypes"),
        ({"names": ["a"], "dtypes": ["bfloat16"], "shapes": []}, "shapes"),
        ({"names": ["a"], "dtypes": ["bfloat16"], "shapes": [[1]], "checksums": ["x", "y"]}, "checksums"),
        ({"names": ["a"], "dtypes": ["bfloat16"], "shapes": [[-1]]}, "shapes[0][0]"),
        ({"names": ["a"], "dtypes": ["bfloat16"]}, "shapes"),
    ],
)
def test_distributed_lists_must_match_the_names(fields, param):
    assert_invalid(bodies.parse_distributed(body(**fields)), param)


def test_tensor_payloads_arrive_base64_and_leave_as_bytes():
    payload = b"\x80\x04 a pickle of named tensors"
    parsed = bodies.parse_tensor(
        body(serialized_named_tensors=[base64.b64encode(payload).decode()], load_format=None, flush_cache=False)
    )
    assert parsed == UpdateFromTensor([payload], flush_cache=False)
    assert_invalid(bodies.parse_tensor(body(serialized_named_tensors=["not base64!"])), "serialized_named_tensors[0]")
    assert_invalid(bodies.parse_tensor(body(serialized_named_tensors=[])), "serialized_named_tensors", ">= 1")


def test_init_group_takes_the_port_as_an_int_or_a_string():
    slime = {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 2}
    expected = InitWeightGroup("10.0.0.1", 29500, 1, 2, "weight_update_group", "nccl")
    assert bodies.parse_init_group(body(**slime)) == expected
    areal = slime | {"master_port": "29500", "group_name": "update_weight_group", "backend": "gloo"}
    assert bodies.parse_init_group(body(**areal)) == InitWeightGroup(
        "10.0.0.1", 29500, 1, 2, "update_weight_group", "gloo"
    )
    assert bodies.parse_init_group(body(**(slime | {"master_port": "065535"}))).master_port == 65535
    for fields, param in (
        ({"master_port": "29x"}, "master_port"),
        ({"master_port": 70000}, "master_port"),
        ({"master_port": "65536"}, "master_port"),
        ({"master_port": "0"}, "master_port"),
        ({"master_port": "8080\n"}, "master_port"),
        ({"master_address": ""}, "master_address"),
        ({"world_size": 2**31, "rank_offset": 1}, "world_size"),  # torch's ranks are int32
        ({"backend": "mpi"}, "backend"),
        ({"world_size": 1}, "world_size"),
        ({"rank_offset": 0}, "rank_offset"),
        ({"rank_offset": 2}, "rank_offset"),
        ({"pp_rank": 0}, "pp_rank"),
    ):
        assert_invalid(bodies.parse_init_group(body(**(slime | fields))), param)


def test_small_bodies_with_sglangs_defaults():
    assert bodies.parse_destroy_group(b"") == DestroyWeightGroup("weight_update_group")
    assert bodies.parse_destroy_group(body(group_name="g")) == DestroyWeightGroup("g")
    assert bodies.parse_version(body(new_version="v2")) == UpdateWeightVersion("v2", abort_all_requests=True)
    assert_invalid(bodies.parse_version(body()), "new_version", "required")
    assert bodies.parse_weights_by_name(body(name="lm_head.weight")) == GetWeightsByName("lm_head.weight", 100)
    assert_invalid(bodies.parse_weights_by_name(body(name="x", truncate_size=0)), "truncate_size")


@pytest.mark.parametrize(
    "raw, tags", [(b"", None), (b"{}", None), (b'{"tags": null}', None), (b'{"tags": ["weights"]}', ["weights"])]
)
def test_memory_bodies_as_slime_and_areal_send_them(raw, tags):
    assert bodies.parse_release(raw) == ReleaseMemory(tags)
    assert bodies.parse_resume(raw) == ResumeMemory(tags)


def test_memory_tags_are_sglangs_and_ours():
    assert bodies.parse_resume(body(tags=["kv_cache", "cuda_graph"])) == ResumeMemory(["kv_cache", "cuda_graph"])
    assert_invalid(bodies.parse_release(body(tags=["gpu"])), "tags[0]")
    assert_invalid(bodies.parse_release(body(tags="weights")), "tags")
