"""The weight_sync actor: the one owner of the weight version, and the trainer's door for new
weights, on `<ns>.admin.weights` (schemas/admin_weights.py).

Thin: it decodes, hands each request to a plain object and replies. Updates, renames, sleep and
wake are exclusive (transaction.py, memory.py): each runs in a task of its own, which answers when
it ends, so the subscription goes on serving meanwhile (a second update is refused at once, a
version read answered). Uploads over the bus are staged by upload_store.py. Reads and the
trainer's group go to the executor as they are.

The version is the executor's to say: this actor reads it at start (a restarted weight_sync
recovers it) and on every `ExecutorInfo` (a restarted executor loads `--model` again and serves
`--weight-version`, whatever this actor committed: it follows the executor, and logs the loss).
"""

import asyncio
from collections.abc import Coroutine
from pathlib import Path

from actors.weight_sync.memory import MEMORY_TIMEOUT_S, MemorySleep
from actors.weight_sync.peers import BusPeers
from actors.weight_sync.transaction import UpdateOptions, WeightTransactions
from actors.weight_sync.upload_store import UploadStore
from actors.weight_sync.versions import VersionBook
from kernel.actor import Actor
from schemas.admin_weights import (
    BeginBusUpload,
    DestroyWeightGroup,
    FinishBusUpload,
    GetWeightsByName,
    GetWeightVersion,
    GroupState,
    InitWeightGroup,
    UpdateFromDisk,
    UpdateFromDistributed,
    UpdateFromTensor,
    UpdateWeightVersion,
    UploadChunk,
    WeightsReply,
    WeightsRequest,
    WeightsUpdated,
    WeightVersion,
)
from schemas.errors import Error
from schemas.executor_weights import (
    DiskSource,
    GroupJoined,
    GroupSource,
    IpcSource,
    JoinWeightGroup,
    LeaveWeightGroup,
    ReadWeight,
)
from schemas.sleep import GetMemory, ReleaseMemory, ResumeMemory
from schemas.step import ExecutorInfo

EXECUTOR_TIMEOUT_S = 30.0  # a read, or leaving a group; and beyond a join's own timeout, for its answer
UPLOAD_HEADROOM_BYTES = 4096  # of a bus message, beside a chunk's data: the rest of UploadChunk
DISK_FORMATS = (None, "auto", "safetensors")


class WeightSyncActor(Actor):
    """Owns the weight version; runs weight updates as transactions; stages bus uploads."""

    name = "weight_sync"

    async def start(self) -> None:
        folder = Path(self.config.supervision.data_dir) / "weight_sync"
        self.versions = VersionBook(folder / "versions.json", self.config.engine.weight_version)
        self.peers = BusPeers(self.bus, self.subjects)
        self.transactions = WeightTransactions(self.peers, self.versions)
        self.memory = MemorySleep(self.peers)
        self.uploads = UploadStore(folder / "uploads", self.bus.max_payload_bytes - UPLOAD_HEADROOM_BYTES)
        self.executor_id: str | None = None
        await self.bus.subscribe(self.subjects.executor_info, ExecutorInfo, self._on_executor_info)
        await self.bus.subscribe(self.subjects.admin_weights, WeightsRequest, self._on_request)
        self.spawn(self._find_executor(), "find_executor")

    @property
    def ready(self) -> bool:
        return self.executor_id is not None

    async def _find_executor(self) -> None:
        while self.executor_id is None:
            info = await self.peers.describe_executor()
            if isinstance(info, ExecutorInfo):
                await self._on_executor_info(info, None)
                return
            await asyncio.sleep(0.2)

    async def _on_executor_info(self, info: ExecutorInfo, _reply_to: str | None) -> None:
        if info.executor_id == self.executor_id:
            return
        committed = self.versions.version
        if self.versions.follow(info.weight_version) and self.executor_id is not None:
            self.log.warning("executor_restarted_with_other_weights", committed=committed, serving=info.weight_version)
        self.executor_id = info.executor_id
        self.log.info("executor_weights", executor=info.executor_id, weight_version=info.weight_version)

    async def _on_request(self, message: WeightsRequest, reply_to: str | None) -> WeightsReply | Error | None:
        if not self.ready and not isinstance(message, BeginBusUpload | UploadChunk):
            # Until the executor says what it serves, the version here is the flag's, not the one
            # an update committed before this actor restarted: no answer is better than a wrong one.
            return Error("unavailable", "weight_sync has not heard from the executor yet", retriable=True)
        match message:
            case UpdateFromDisk(model_path=path, load_format=load_format):
                if load_format not in DISK_FORMATS:
                    return Error(
                        "invalid_request",
                        f"load_format {load_format!r} is not served; give auto or safetensors",
                        param="load_format",
                    )
                return self._update(reply_to, "update_from_disk", DiskSource(path), message, model_path=path)
            case UpdateFromDistributed():
                if error := _check_distributed(message):
                    return error
                source = GroupSource(
                    message.group_name,
                    message.names,
                    [d.removeprefix("torch.") for d in message.dtypes],
                    message.shapes,
                    message.load_format == "flattened_bucket",
                    message.checksums,
                )
                return self._update(reply_to, "update_from_distributed", source, message, full=False)
            case UpdateFromTensor():
                source = IpcSource(message.serialized_named_tensors, message.load_format == "flattened_bucket")
                return self._update(reply_to, "update_from_tensor", source, message, full=False)
            case BeginBusUpload():
                return await asyncio.to_thread(self.uploads.begin, message)
            case UploadChunk():
                return await asyncio.to_thread(self.uploads.write, message)
            case FinishBusUpload(upload_id=upload_id):
                folder = self.uploads.checkpoint(upload_id)
                if isinstance(folder, Error):
                    return folder
                return self._exclusive(reply_to, "finish_bus_upload", self._apply_upload(upload_id, folder, message))
            case UpdateWeightVersion(new_version, abort_all_requests):
                return self._exclusive(
                    reply_to, "update_weight_version", self.transactions.rename(new_version, abort_all_requests)
                )
            case GetWeightVersion():
                return WeightVersion(self.versions.version, self.versions.model_path)
            case GetWeightsByName(name, truncate_size):
                return await self.peers.executor(ReadWeight(name, truncate_size), EXECUTOR_TIMEOUT_S)
            case InitWeightGroup():
                join_timeout_s = self.config.engine.weight_group_join_timeout_s + EXECUTOR_TIMEOUT_S
                joined = await self.peers.executor(JoinWeightGroup(message), join_timeout_s)
                if isinstance(joined, GroupJoined):
                    return GroupState(True, f"joined group {joined.group_name} as rank {message.rank_offset}")
                return joined
            case DestroyWeightGroup(group_name):
                left = await self.peers.executor(LeaveWeightGroup(group_name), EXECUTOR_TIMEOUT_S)
                return left if isinstance(left, Error) else GroupState(True, f"left group {group_name}")
            case ReleaseMemory(tags):
                return self._exclusive(reply_to, "release_memory", self.memory.release(tags))
            case ResumeMemory(tags):
                return self._exclusive(reply_to, "resume_memory", self.memory.resume(tags))
            case GetMemory():
                return await self.peers.executor(message, MEMORY_TIMEOUT_S)

    def _update(
        self,
        reply_to: str | None,
        what: str,
        source: DiskSource | GroupSource | IpcSource,
        message: UpdateFromDisk | UpdateFromDistributed | UpdateFromTensor,
        full: bool = True,
        model_path: str | None = None,
    ) -> Error | None:
        update = self.transactions.update(source, full, UpdateOptions.of(message), model_path)
        return self._exclusive(reply_to, what, update)

    async def _apply_upload(self, upload_id: str, folder: Path, message: FinishBusUpload) -> WeightsUpdated | Error:
        """A complete upload is a checkpoint on disk: loaded as one, then removed once it serves."""
        updated = await self.transactions.update(DiskSource(str(folder)), True, UpdateOptions.of(message))
        if isinstance(updated, WeightsUpdated):
            await asyncio.to_thread(self.uploads.remove, upload_id)
        return updated

    def _exclusive(self, reply_to: str | None, what: str, work: Coroutine) -> Error | None:
        """Starts `work` unless another exclusive operation runs (then refused now); its task
        answers `reply_to` when it ends."""
        if refused := self.transactions.claim(what):
            work.close()
            return refused
        self.spawn(self._answer(reply_to, what, work), what)
        return None

    async def _answer(self, reply_to: str | None, what: str, work: Coroutine) -> None:
        try:
            reply = await work
        except Exception as exc:  # as a bus handler's failure: the requester gets an Error, the actor serves on
            self.log.exception("weight_operation_failed", operation=what)
            reply = Error("internal", f"{what} failed: {type(exc).__name__}: {exc}", retriable=True)
        finally:
            self.transactions.release()
        if reply_to:
            await self.bus.reply(reply_to, reply)


def _check_distributed(message: UpdateFromDistributed) -> Error | None:
    """The lists describe one tensor per name, in order (SGLang's plural fields)."""
    count = len(message.names)
    for field, values in (("dtypes", message.dtypes), ("shapes", message.shapes)):
        if len(values) != count:
            return Error("invalid_request", f"{field} has {len(values)} entries for {count} names", param=field)
    if message.checksums and len(message.checksums) != count:
        return Error(
            "invalid_request", f"checksums has {len(message.checksums)} entries for {count} names", param="checksums"
        )
    return None
