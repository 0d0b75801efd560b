"""Sessions outlive the processes that hold them, tested by killing those: a session continues
after its scheduler is killed (-9) and after the whole server restarts, with the output of a run
that never restarted, and after the restart its earlier turns come back from the disk tier, not
recomputed; the snapshot actor killed mid-write under load loses and corrupts nothing; an expired
session is not restored, and an unreadable session file is set aside while the rest restore."""

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from actors.cache_tier.host_segment import remove_segments  # what a server that did not stop cleanly left
from actors.scheduler.session_records import restored_session
from actors.snapshot.session_store import UNREADABLE_DIR, decode_file, encode_file
from ops.local_server import RunningServer, start_server
from schemas.requests import Tenant
from schemas.snapshot import SessionRecord, TurnRecord

FLAGS = ("--num-kv-blocks", "256", "--host-kv-blocks", "64", "--disk-kv-gb", "1")
TURNS = [list(range(300, 340)), list(range(700, 711)), list(range(900, 917))]  # each turn's new tokens


class Deployment:
    """One server for the module, which a test may stop and start again on the same data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.server = start_server(data_dir, *FLAGS)

    def restart(self) -> None:
        assert self.server.stop() == 0
        self.server = start_server(self.data_dir, *FLAGS)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    running = Deployment(tmp_path_factory.mktemp("durable"))
    yield running
    running.server.stop()
    remove_segments(running.data_dir)


def open_session(server: RunningServer, **body) -> str:
    response = httpx.post(f"{server.base_url}/v1/sessions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def take_turn(server: RunningServer, session_id: str, new_ids: list[int], max_new_tokens: int = 8) -> httpx.Response:
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    body = {"input_ids": new_ids, "sampling_params": sampling, "session_params": {"id": session_id}}
    return httpx.post(f"{server.base_url}/generate", json=body, timeout=60)


def turn_output(server: RunningServer, session_id: str, new_ids: list[int]) -> tuple[int, list[int]]:
    """The turn's whole prompt length, and its output (greedy)."""
    meta, output = turn_reply(server, session_id, new_ids)
    return meta["prompt_tokens"], output


def turn_reply(server: RunningServer, session_id: str, new_ids: list[int]) -> tuple[dict, list[int]]:
    """The turn's meta_info and its output (greedy)."""
    response = take_turn(server, session_id, new_ids)
    assert response.status_code == 200, response.text
    return response.json()["meta_info"], response.json()["output_ids"]


def saved(server: RunningServer) -> dict[str, SessionRecord]:
    """The session files as they are on disk now, each read as the snapshot actor reads it."""
    return {p.stem: decode_file(p.read_bytes()) for p in (server.data_dir / "sessions").glob("*.session")}


def wait_for_restart(server: RunningServer, actor: str, starts: int) -> None:
    server.wait_for("child_started", timeout_s=60, count=starts, child=actor)
    server.wait_for("actor_started", timeout_s=60, pid=server.child_pid(actor))


def test_a_session_outlives_its_killed_scheduler(deployment):
    server = deployment.server
    reference, session = open_session(server), open_session(server)
    never_restarted = [turn_output(server, reference, ids) for ids in TURNS]
    assert [turn_output(server, session, ids) for ids in TURNS[:2]] == never_restarted[:2]

    os.kill(server.child_pid("scheduler"), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (response := take_turn(server, session, TURNS[2])).status_code == 503:  # no scheduler, or no executor yet
        assert time.monotonic() < deadline, response.text
        time.sleep(0.1)
    assert response.status_code == 200, response.text  # never a 404: a session request waits for the restore
    assert (response.json()["meta_info"]["prompt_tokens"], response.json()["output_ids"]) == never_restarted[2]
    assert server.find("sessions_restored")[-1]["sessions"] >= 2


def test_a_killed_snapshot_actor_loses_and_corrupts_nothing(deployment):
    """Sessions change all the time while the snapshot actor is killed: the changes sent while it
    was down are sent again when it is back, and the sessions closed meanwhile leave the disk."""
    server = deployment.server
    sessions = [open_session(server) for _ in range(10)]
    conversations = {s: [] for s in sessions}  # each session's tokens so far, as its client knows them
    turns_taken = threading.Semaphore(0)
    stop = threading.Event()

    def chat(session_id: str) -> None:
        for i in range(1000):
            if stop.is_set():
                return
            new_ids = [100 + (i * 7 + j) % 900 for j in range(5)]
            response = take_turn(server, session_id, new_ids, max_new_tokens=2)
            if response.status_code == 404:
                return  # closed by the test
            assert response.status_code == 200, response.text
            conversations[session_id] += new_ids + response.json()["output_ids"]
            turns_taken.release()

    threads = [threading.Thread(target=chat, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    try:
        for _ in range(20):
            assert turns_taken.acquire(timeout=60)
        os.kill(server.child_pid("snapshot"), signal.SIGKILL)
        closed = sessions[:3]  # while it is down: their drops are lost with it
        for session_id in closed:
            assert httpx.delete(f"{server.base_url}/v1/sessions/{session_id}", timeout=30).status_code == 200
        wait_for_restart(server, "snapshot", starts=2)
        for _ in range(20):
            assert turns_taken.acquire(timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)

    open_sessions = sessions[3:]
    deadline = time.monotonic() + 30
    while True:  # the snapshot actor writes what it was sent again
        on_disk = saved(server)
        latest = {s: _latest_tokens(on_disk[s]) for s in open_sessions if s in on_disk}
        if latest == {s: conversations[s] for s in open_sessions} and not set(closed) & on_disk.keys():
            break
        assert time.monotonic() < deadline, f"on disk: {latest}, expected {conversations}"
        time.sleep(0.2)
    assert not (server.data_dir / "sessions" / UNREADABLE_DIR).exists()


def _latest_tokens(record: SessionRecord) -> list[int]:
    turns = restored_session(record).turns
    return turns[next(reversed(turns))].token_ids


@pytest.fixture(scope="module")
def whole_restart(deployment):
    """A session with two turns, a reference with three; the server stopped (SIGTERM); an expired
    session and unreadable files planted; started again on the same data dir."""
    server = deployment.server
    reference, session, damaged = open_session(server), open_session(server), open_session(server)
    never_restarted = [turn_output(server, reference, ids) for ids in TURNS]
    first_two = [turn_output(server, session, ids) for ids in TURNS[:2]]
    turn_output(server, damaged, TURNS[0])
    folder = server.data_dir / "sessions"
    deployment.server.stop()

    expired = SessionRecord(
        "expiredsession", Tenant(), 256, 60.0, time.time() - 61, [TurnRecord("t1", None, 0, list(range(300, 320)))]
    )
    (folder / "expiredsession.session").write_bytes(encode_file(expired))
    data = bytearray((folder / f"{damaged}.session").read_bytes())
    data[-1] ^= 0x01
    (folder / f"{damaged}.session").write_bytes(bytes(data))
    (folder / "junk.session").write_bytes(b"\x00" * 40)

    deployment.restart()
    return deployment.server, session, damaged, first_two, never_restarted


def test_a_session_outlives_a_whole_server_restart(whole_restart):
    server, session, _, first_two, never_restarted = whole_restart
    assert first_two == never_restarted[:2]
    meta, output = turn_reply(server, session, TURNS[2])
    assert (meta["prompt_tokens"], output) == never_restarted[2]
    first_turn_blocks = (first_two[0][0] + len(first_two[0][1])) // 16 * 16  # long on disk before the stop
    assert meta["cached_tokens"] >= first_turn_blocks  # read back from the disk tier, not recomputed


def test_an_expired_session_is_not_restored(whole_restart):
    server = whole_restart[0]
    assert take_turn(server, "expiredsession", [1, 2, 3]).status_code == 404
    assert server.find("session_expired_while_down", session_id="expiredsession")
    assert not (server.data_dir / "sessions" / "expiredsession.session").exists()


def test_an_unreadable_session_file_is_set_aside_and_the_rest_restore(whole_restart):
    server, session, damaged = whole_restart[:3]
    assert take_turn(server, damaged, [1, 2, 3]).status_code == 404
    aside = sorted(p.name.split(".")[0] for p in (server.data_dir / "sessions" / UNREADABLE_DIR).iterdir())
    assert aside == sorted([damaged, "junk"])
    assert len(server.find("session_file_unreadable")) == 2
    assert take_turn(server, session, [5, 6, 7]).status_code == 200
