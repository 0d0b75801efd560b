"""The update transaction on its own, against peers that keep a scheduler's pause and an executor's
weights in memory: the pause it takes (and the one it leaves alone), the version it names and
commits, the cache generation, one operation at a time, and a failed load that changes nothing."""

from dataclasses import dataclass, field

from actors.weight_sync.transaction import UpdateOptions, WeightTransactions
from actors.weight_sync.versions import VersionBook
from schemas.admin import CacheFlushed, PauseState
from schemas.admin_weights import WeightsUpdated, WeightVersion
from schemas.errors import Error
from schemas.executor_weights import ApplyWeights, DiskSource, SetVersion, WeightsApplied
from schemas.requests import Aborted
from schemas.scheduler_weights import CacheGeneration, WeightsCommitted
from schemas.step import ExecutorInfo


@dataclass
class Peers:
    """A scheduler with `in_flight` requests (`running` of them running) and an executor serving
    `version`; `fail_apply`: the executor's answer to the next load."""

    in_flight: int = 2
    running: int = 2
    mode: str | None = None
    version: str = "default"
    fail_apply: Error | None = None
    calls: list = field(default_factory=list)

    async def pause(self, mode):
        self.calls.append(("pause", mode))
        aborted = self.in_flight if mode == "abort" else 0
        self.in_flight -= aborted
        self.mode = mode
        return PauseState(True, mode, aborted, self.in_flight)

    async def pause_state(self):
        return PauseState(self.mode is not None, self.mode, 0, self.in_flight)

    async def resume(self):
        self.calls.append(("resume",))
        if self.mode is None:
            return Error("invalid_request", "not paused")
        self.mode = None
        return PauseState(False, None)

    async def running_requests(self):
        self.running = max(self.running - 1, 0)  # they finish, one per look
        return self.running

    async def flush_cache(self):
        return CacheFlushed(0)

    async def abort_all(self):
        self.calls.append(("abort_all",))
        return Aborted([])

    async def commit(self, message: WeightsCommitted):
        self.calls.append(("commit", message.version, message.keep_cache))
        return CacheGeneration(1, 0)

    async def executor(self, message, timeout_s):
        match message:
            case ApplyWeights(version=version):
                self.calls.append(("apply", version))
                if self.fail_apply is not None:
                    return self.fail_apply
                self.version = version
                return WeightsApplied(version, 3, 300, 0.1)
            case SetVersion(version):
                self.version = version
                return WeightVersion(version)

    async def describe_executor(self):
        return ExecutorInfo("e", 8, 16, 64, 100, "cpu", "float32", self.version)


def options(**given) -> UpdateOptions:
    fields = {"weight_version": None, "abort_all_requests": False, "flush_cache": True, "pause_mode": None}
    return UpdateOptions(**(fields | given))


def make(tmp_path, peers: Peers) -> WeightTransactions:
    return WeightTransactions(peers, VersionBook(tmp_path / "versions.json", peers.version))


SOURCE = DiskSource("/checkpoint")


async def test_an_update_waits_for_the_running_requests_then_commits_and_continues(tmp_path):
    peers = Peers()
    updated = await make(tmp_path, peers).update(SOURCE, True, options())
    assert isinstance(updated, WeightsUpdated) and (updated.weight_version, updated.tensors) == ("1", 3)
    assert peers.running == 0  # "wait": the load came after they finished
    assert peers.calls == [("pause", "wait"), ("apply", "1"), ("commit", "1", False), ("resume",)]


async def test_unnamed_versions_count_the_commits_across_restarts(tmp_path):
    peers = Peers()
    first = make(tmp_path, peers)
    await first.update(SOURCE, True, options())
    await first.update(SOURCE, True, options(weight_version="named"))
    again = make(tmp_path, peers)  # a restarted actor: the count is in the file
    assert (await again.update(SOURCE, True, options())).weight_version == "3"


async def test_abort_all_requests_aborts_and_counts_them(tmp_path):
    peers = Peers(in_flight=5)
    updated = await make(tmp_path, peers).update(SOURCE, True, options(abort_all_requests=True, flush_cache=False))
    assert updated.num_paused_requests == 5
    assert peers.calls[0] == ("pause", "abort") and ("commit", "1", True) in peers.calls


async def test_generation_paused_before_stays_paused(tmp_path):
    peers = Peers(mode="in_place")
    updated = await make(tmp_path, peers).update(SOURCE, True, options(pause_mode="retract"))
    assert (updated.pause_s, updated.num_paused_requests) == (0.0, 0)
    assert peers.mode == "in_place" and peers.calls == [("apply", "1"), ("commit", "1", False)]


async def test_a_failed_load_keeps_the_old_version_and_continues(tmp_path):
    refused = Error("invalid_request", "model.norm.weight has NaN or infinite values; the old weights are restored")
    peers = Peers(fail_apply=refused)
    transactions = make(tmp_path, peers)
    assert await transactions.update(SOURCE, True, options(pause_mode="in_place")) == refused
    assert transactions.versions.version == "default" and peers.mode is None
    # The cache started its new generation during the load (nothing ran meanwhile); the scheduler
    # hears the old version's name again.
    assert [c for c in peers.calls if c[0] == "commit"] == [("commit", "1", False), ("commit", "default", True)]
    peers.fail_apply = None
    assert (await transactions.update(SOURCE, True, options())).weight_version == "1"  # nothing was counted


async def test_a_load_whose_reply_was_lost_follows_the_executor(tmp_path):
    peers = Peers(fail_apply=Error("timeout", "no reply", retriable=True))
    transactions = make(tmp_path, peers)
    peers.version = "1"  # it did load before the reply was lost
    assert isinstance(await transactions.update(SOURCE, True, options()), WeightsUpdated)
    assert transactions.versions.version == "1" and ("commit", "1", False) in peers.calls


async def test_one_operation_at_a_time(tmp_path):
    transactions = make(tmp_path, Peers())
    assert transactions.claim("update_from_disk") is None
    refused = transactions.claim("update_from_tensor")
    assert isinstance(refused, Error) and "update_from_disk is running" in refused.message
    transactions.release()
    assert transactions.claim("update_from_tensor") is None


async def test_a_rename_aborts_first_and_keeps_the_cache(tmp_path):
    peers = Peers()
    transactions = make(tmp_path, peers)
    assert await transactions.rename("v7", abort_all_requests=True) == WeightVersion("v7")
    assert peers.calls == [("abort_all",), ("commit", "v7", True)]
    assert (peers.version, transactions.versions.version) == ("v7", "v7")
    assert (await transactions.update(SOURCE, True, options())).weight_version == "1"  # a rename is no update
