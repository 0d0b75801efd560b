"""The scheduler's books for the executor that answered: the batcher built for its KV pool, or
reset for a new executor, and the sessions' token budget. Plain functions of the executor's
`ExecutorInfo` and the configuration; the scheduler actor (actor.py) keeps what they return.
"""

from actors.scheduler.batching import ContinuousBatcher
from actors.scheduler.cache_tenancy import TenancyPolicy
from kernel.config import EngineConfig, TenancyConfig
from schemas.step import ExecutorInfo


def new_batcher(info: ExecutorInfo, engine: EngineConfig, tenancy: TenancyConfig) -> ContinuousBatcher:
    """A batcher for the first executor seen: its pool, its model's limits, and the KV tiers of its
    weights and dtype (the disk tier's only when one is configured)."""
    return ContinuousBatcher(
        info.num_blocks,
        info.block_size,
        info.max_model_len,
        info.vocab_size,
        engine.max_num_seqs,
        engine.max_prefill_tokens,
        prefix_caching=engine.prefix_caching,
        tenancy=TenancyPolicy(tenancy.public_prefix_tenants, tenancy.public_prefix_window_s),
        host_slots=info.host_kv_slots,
        kv_fingerprint=f"{info.weights_fingerprint}|{info.dtype}",
        disk_segment=info.host_segment if engine.disk_kv_gb > 0 else "",
        kv_block_bytes=info.kv_block_bytes,
    )


def reset_batcher(batcher: ContinuousBatcher, info: ExecutorInfo, engine: EngineConfig) -> None:
    """Points `batcher` at a new executor: every started request goes back to the queue
    (`ContinuousBatcher.reset_executor`)."""
    batcher.reset_executor(
        info.num_blocks,
        info.block_size,
        info.max_model_len,
        info.vocab_size,
        info.host_kv_slots,
        f"{info.weights_fingerprint}|{info.dtype}",
        info.host_segment if engine.disk_kv_gb > 0 else "",
        info.kv_block_bytes,
    )


def session_budget_tokens(info: ExecutorInfo, engine: EngineConfig) -> int:
    """The tokens open sessions may keep pinned: `--session-budget-tokens`, else half the pool."""
    budget = engine.session_budget_tokens
    return info.num_blocks * info.block_size // 2 if budget is None else budget
