"""Live weights through a real server: a trainer asks the weight_sync actor over the bus to load a
checkpoint, and rollout clients see the new weights' tokens, each with its version.

The server serves a tiny Llama (seed 3) as version "base"; `new` is the same shape with other
weights (seed 4). The tests run in file order on one server; each says which weights it expects.
"""

import asyncio
import os
import signal

import msgspec
import nats.errors
import pytest
from safetensors.torch import load_file, save_file

from gpu.model_builder import build_model_dir
from ops import bus_weights
from ops.local_server import start_server
from schemas.admin import ContinueGeneration, GetPause, PauseGeneration, PauseState
from schemas.admin_weights import (
    DestroyWeightGroup,
    FinishBusUpload,
    GetWeightVersion,
    GroupState,
    InitWeightGroup,
    UpdateFromDisk,
    UpdateFromDistributed,
    UploadChunk,
    WeightsUpdated,
    WeightVersion,
)
from schemas.errors import Error
from tests.e2e.weights_client import Reference, admin, ask, generate, streamed, swapped_mid_request
from tests.gpu.weight_trainer import Trainer
from tests.over_http import random_prompts

PROMPTS = random_prompts(3, seed=11, high=1000)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    base = build_model_dir(root / "base", arch="llama", size="tiny", seed=3)
    new = build_model_dir(root / "new", arch="llama", size="tiny", seed=4)
    return base, new


@pytest.fixture(scope="module")
def references(checkpoints):
    return tuple(Reference(d) for d in checkpoints)


@pytest.fixture(scope="module")
def weights_server(tmp_path_factory, checkpoints):
    running = start_server(
        tmp_path_factory.mktemp("weights"),
        "--num-kv-blocks",
        "256",
        "--weight-version",
        "base",
        model=str(checkpoints[0]),
    )
    yield running
    running.stop()


@pytest.fixture
async def nc(weights_server):
    connection = await weights_server.connect_nats()
    yield connection
    await connection.drain()


async def load(nc, model_dir, **options) -> WeightsUpdated:
    updated = await ask(nc, UpdateFromDisk(str(model_dir), **options))
    assert isinstance(updated, WeightsUpdated) and updated.success, updated
    return updated


async def test_a_disk_update_serves_the_new_checkpoints_greedy_tokens(nc, checkpoints, references):
    base, new = references
    before = [await generate(nc, p, 16) for p in PROMPTS]
    assert [r.token_ids for r in before] == [base(p, 16) for p in PROMPTS]
    assert {(r.weight_version, tuple(r.version_spans)) for r in before} == {("base", ((0, "base"),))}

    updated = await load(nc, checkpoints[1])  # names no version: the count of updates, this the first
    assert (updated.weight_version, updated.num_paused_requests) == ("1", 0)
    assert updated.tensors > 0 and updated.bytes > 0
    assert await ask(nc, GetWeightVersion()) == WeightVersion("1", str(checkpoints[1]))
    after = [await generate(nc, p, 16) for p in PROMPTS]
    assert [r.token_ids for r in after] == [new(p, 16) for p in PROMPTS]
    assert {(r.weight_version, tuple(r.version_spans)) for r in after} == {("1", ((0, "1"),))}

    await load(nc, checkpoints[0], weight_version="base-again")
    assert [(await generate(nc, p, 16)).token_ids for p in PROMPTS] == [base(p, 16) for p in PROMPTS]


async def test_a_bad_checkpoint_is_refused_and_the_old_weights_serve_on(nc, checkpoints, references, tmp_path):
    await load(nc, checkpoints[0], weight_version="good")
    bad = tmp_path / "bad"
    bad.mkdir()
    tensors = load_file(checkpoints[1] / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"  # late in the file: the earlier ones are written first
    tensors[name][3, 5] = float("nan")
    save_file(tensors, bad / "model.safetensors")
    refused = await ask(nc, UpdateFromDisk(str(bad), weight_version="bad"))
    assert isinstance(refused, Error) and name in refused.message, refused
    assert await ask(nc, GetWeightVersion()) == WeightVersion("good", str(checkpoints[0]))
    results = [await generate(nc, p, 16) for p in PROMPTS]
    assert [r.token_ids for r in results] == [references[0](p, 16) for p in PROMPTS]
    assert {r.weight_version for r in results} == {"good"}


async def test_two_updates_at_once_one_is_refused(nc, checkpoints):
    await load(nc, checkpoints[0], weight_version="b0")
    started = asyncio.Event()
    tokens = 1800  # a second or more of the tiny model's steps: it still runs when the second update comes
    running = asyncio.create_task(streamed(nc, PROMPTS[0], tokens, started))
    await asyncio.wait_for(started.wait(), 60)
    first = asyncio.create_task(ask(nc, UpdateFromDisk(str(checkpoints[1]), weight_version="w1")))  # waits for it
    await asyncio.sleep(0.3)
    second = await ask(nc, UpdateFromDisk(str(checkpoints[1]), weight_version="w2"))
    assert isinstance(second, Error) and "one weight operation at a time" in second.message
    _, result = await running
    assert (len(result.token_ids), result.version_spans) == (tokens, [(0, "b0")])  # "wait": it finished first
    assert (await first).weight_version == "w1"
    assert await ask(nc, GetWeightVersion()) == WeightVersion("w1", str(checkpoints[1]))


async def test_an_in_place_update_changes_versions_exactly_at_the_token(nc, checkpoints):
    """Streams under an in-place pause that a client started: the update keeps it paused, the
    client continues it, and each stream's tokens are those of the old weights up to its span's
    index and of the new ones after, with its KV kept: none lost, none repeated."""
    await load(nc, checkpoints[0], weight_version="old")
    started = [asyncio.Event() for _ in PROMPTS]
    streams = [asyncio.create_task(streamed(nc, p, 200, e)) for p, e in zip(PROMPTS, started)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
    assert isinstance(await admin(nc, "pause", PauseGeneration("in_place"), PauseState), PauseState)
    updated = await load(nc, checkpoints[1], weight_version="new")
    assert updated.pause_s == 0.0  # paused before: the update neither paused nor continued
    state = await admin(nc, "pause_state", GetPause(), PauseState)
    assert (state.paused, state.mode) == (True, "in_place")
    assert (await admin(nc, "continue", ContinueGeneration(), PauseState)).paused is False
    for prompt, (chunks, result) in zip(PROMPTS, await asyncio.gather(*streams)):
        assert [t for c in chunks for t in c.token_ids] == result.token_ids and len(result.token_ids) == 200
        assert [c.sequence for c in chunks] == list(range(len(chunks)))
        (zero, old), (switch_at, new) = result.version_spans
        assert (zero, old, new, result.weight_version) == (0, "old", "new", "new") and 2 <= switch_at < 200
        versions = [c.weight_version for c in chunks for _ in c.token_ids]
        assert versions == ["old"] * switch_at + ["new"] * (200 - switch_at)
        assert result.token_ids == swapped_mid_request(checkpoints[0], checkpoints[1], prompt, 200, switch_at)


async def test_an_update_pausing_in_place_itself_loses_no_token(nc, checkpoints):
    await load(nc, checkpoints[0], weight_version="old2")
    started = [asyncio.Event() for _ in PROMPTS]
    streams = [asyncio.create_task(streamed(nc, p, 400, e)) for p, e in zip(PROMPTS, started)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
    updated = await load(nc, checkpoints[1], weight_version="new2", pause_mode="in_place")
    assert updated.pause_s > 0 and updated.num_paused_requests <= len(PROMPTS)
    assert (await admin(nc, "pause_state", GetPause(), PauseState)).paused is False  # it continued
    switched = 0
    for prompt, (chunks, result) in zip(PROMPTS, await asyncio.gather(*streams)):
        assert [t for c in chunks for t in c.token_ids] == result.token_ids and len(result.token_ids) == 400
        switch_at = dict((v, i) for i, v in result.version_spans).get("new2", 400)
        assert result.version_spans[0] == (0, "old2")
        switched += switch_at < 400
        assert result.token_ids == swapped_mid_request(checkpoints[0], checkpoints[1], prompt, 400, switch_at)
    assert switched > 0


async def test_a_flushing_update_never_serves_old_kv_and_a_keeping_one_does(nc, checkpoints, references):
    prompt = random_prompts(1, seed=99, high=1000)[0] * 3  # several whole blocks
    await load(nc, checkpoints[0], weight_version="c0")
    await generate(nc, prompt, 4)
    assert (await generate(nc, prompt, 4)).cached_tokens > 0  # cached under c0
    await load(nc, checkpoints[1], weight_version="c1")  # flush_cache defaults to true
    fresh = await generate(nc, prompt, 16)
    assert fresh.cached_tokens == 0 and fresh.token_ids == references[1](prompt, 16)
    assert (await generate(nc, prompt, 4)).cached_tokens > 0  # cached again, under c1
    await load(nc, checkpoints[0], weight_version="c2", flush_cache=False)
    kept = await generate(nc, prompt, 4)
    assert kept.cached_tokens > 0 and kept.weight_version == "c2"  # the KV of c1, kept as asked


async def test_a_trainer_broadcasts_over_its_group_into_the_server(nc, checkpoints, references):
    """A real trainer process (rank 0, gloo) broadcasts the new checkpoint as one flattened bucket;
    the server joins at rank 1, receives it in place, checks the trainer's checksums, and serves it."""
    await load(nc, checkpoints[0], weight_version="g0")
    trainer = Trainer(checkpoints[1], "--flattened")
    try:
        joined = await ask(nc, InitWeightGroup("127.0.0.1", trainer.port, 1, 2, backend="gloo"))
        assert joined == GroupState(True, "joined group weight_update_group as rank 1")
        body = await asyncio.to_thread(trainer.request)
        update = UpdateFromDistributed(**body, weight_version="broadcast")
        updated = await ask(nc, update)
        assert isinstance(updated, WeightsUpdated) and updated.tensors == len(body["names"]), updated
        assert await asyncio.to_thread(trainer.said) == "done"
        assert (await ask(nc, DestroyWeightGroup())).success
    finally:
        trainer.close()
    results = [await generate(nc, p, 16) for p in PROMPTS]
    assert [r.token_ids for r in results] == [references[1](p, 16) for p in PROMPTS]
    assert {r.weight_version for r in results} == {"broadcast"}


async def test_a_trainer_that_dies_mid_broadcast_changes_nothing(nc, checkpoints, references):
    await load(nc, checkpoints[0], weight_version="before-death")
    trainer = Trainer(checkpoints[1], "--pause-after", "3")
    try:
        assert (await ask(nc, InitWeightGroup("127.0.0.1", trainer.port, 1, 2, backend="gloo"))).success
        update = asyncio.create_task(ask(nc, UpdateFromDistributed(**await asyncio.to_thread(trainer.request))))
        assert await asyncio.to_thread(trainer.said) == "paused"
        trainer.kill()
        refused = await update
        assert isinstance(refused, Error) and "old weights serve on" in refused.message, refused
    finally:
        trainer.close()
    assert await ask(nc, GetWeightVersion()) == WeightVersion("before-death", str(checkpoints[0]))
    assert [(await generate(nc, p, 16)).token_ids for p in PROMPTS] == [references[0](p, 16) for p in PROMPTS]


async def test_a_bus_upload_resumes_after_a_nats_server_restart(nc, weights_server, checkpoints, references):
    """A remote trainer uploads the new checkpoint in chunks; the bus goes down halfway (the
    nats-server killed, restarted by the supervisor); it asks which chunks are missing and sends
    those; a chunk that arrived corrupt fails its tensor's checksum and is sent again."""
    await load(nc, checkpoints[0], weight_version="u0")
    tensors = load_file(checkpoints[1] / "model.safetensors")
    begin = bus_weights.manifest("upload-1", tensors, chunk_bytes=16 * 1024)
    values = list(tensors.values())
    state = await bus_weights.request(nc, begin)
    everything = {t: list(range(-(-v.numel() * 4 // begin.chunk_bytes))) for t, v in enumerate(values)}
    assert state.missing == everything
    sent = [(t, c) for t, chunks in everything.items() for c in chunks][: sum(map(len, everything.values())) // 2]
    for tensor, chunk in sent:
        data = bus_weights.chunk_of(values, begin.chunk_bytes, tensor, chunk)
        if (tensor, chunk) == sent[0]:
            data = bytes([data[0] ^ 1]) + data[1:]  # corrupt: its tensor fails once whole
        await nc.publish("llm.admin.weights", msgspec.msgpack.encode(UploadChunk("upload-1", tensor, chunk, data)))
    await nc.flush()
    await asyncio.sleep(0.5)
    os.kill(weights_server.process_pids()["nats-server"], signal.SIGKILL)
    await asyncio.to_thread(weights_server.wait_for, "nats_started", 60, 2)

    state = await bus_weights.request(nc, begin)  # asked again until the bus is back
    assert 0 < sum(map(len, state.missing.values())) < sum(map(len, everything.values()))
    await bus_weights.send_missing(nc, begin, values)
    assert weights_server.find("weight_check_failed", tensor=begin.tensors[sent[0][0]].name)
    updated = await bus_weights.finish(nc, FinishBusUpload("upload-1", weight_version="uploaded"))
    assert isinstance(updated, WeightsUpdated) and updated.weight_version == "uploaded", updated
    assert [(await generate(nc, p, 16)).token_ids for p in PROMPTS] == [references[1](p, 16) for p in PROMPTS]


async def test_a_restarted_weight_sync_recovers_the_version_from_the_executor(nc, weights_server, checkpoints):
    """Asked again and again from the kill on, the restarted actor never names a version it has not
    checked with the executor: it answers "unavailable" (retriable) until it has, then the version
    its file kept."""
    await load(nc, checkpoints[1], weight_version="kept")
    os.kill(weights_server.child_pid("weight_sync"), signal.SIGKILL)
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        assert asyncio.get_running_loop().time() < deadline, "no version within 60 s of the kill"
        try:  # a request can reach the killed actor's subscription, which the server still holds
            answer = await ask(nc, GetWeightVersion(), timeout_s=0.5)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            continue
        if not isinstance(answer, Error):
            break
        assert answer.code == "unavailable" and answer.retriable, answer
        await asyncio.sleep(0.02)
    assert answer == WeightVersion("kept", str(checkpoints[1]))  # from its file
    assert (await load(nc, checkpoints[0])).weight_version.isdigit()  # the count went on from the file


async def test_a_restarted_executor_serves_the_base_model_and_its_version(nc, weights_server, checkpoints, references):
    """A new executor loads --model again: the weight_sync actor follows it (logging the loss) and
    never claims a version the executor does not serve."""
    await load(nc, checkpoints[1], weight_version="lost")
    os.kill(weights_server.child_pid("executor"), signal.SIGKILL)
    await asyncio.to_thread(weights_server.wait_for, "executor_restarted_with_other_weights", 120)
    assert await ask(nc, GetWeightVersion()) == WeightVersion("base", None)  # the model it started with
    results = [await generate(nc, p, 16) for p in PROMPTS]
    assert [r.token_ids for r in results] == [references[0](p, 16) for p in PROMPTS]
    assert {r.weight_version for r in results} == {"base"}
