"""Admin conversations on `<ns>.admin.<verb>`, also served over HTTP under `/admin/`."""

import msgspec


class GetStats(msgspec.Struct, frozen=True, tag="get_stats"):
    pass


class SchedulerStats(msgspec.Struct, frozen=True, tag="scheduler_stats"):
    waiting: int  # requests queued, holding no blocks
    running: int  # requests started on the executor
    total_blocks: int
    free_blocks: int
