"""Sleep and wake: the executor's device memory given back to the driver and taken again, by tag.
A trainer asks weight_sync on `<ns>.admin.weights` (schemas/admin_weights.py), which passes the
same messages on to the executor on `<ns>.executor.weights` (schemas/executor_weights.py).
"""

from typing import Literal

import msgspec

MemoryTag = Literal["weights", "kv_cache", "cuda_graph"]


class ReleaseMemory(msgspec.Struct, frozen=True, tag="release_memory"):
    """Sleep: running requests are retracted, and the tagged device memory goes back to the driver
    (None: every tag). Weights are kept in pinned host memory unless an update will follow."""

    tags: list[MemoryTag] | None = None


class ResumeMemory(msgspec.Struct, frozen=True, tag="resume_memory"):
    tags: list[MemoryTag] | None = None


class GetMemory(msgspec.Struct, frozen=True, tag="get_memory"):
    pass


class MemoryState(msgspec.Struct, frozen=True, tag="memory_state"):
    released: list[MemoryTag]  # the tags whose memory is back with the driver now
    device_bytes: int = 0  # device memory the executor holds now
