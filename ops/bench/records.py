"""The records of what `python -m ops.bench` measured, as its `--json` file holds them: each field
is a key of that JSON, which tests/ops, `ops.bench.plot` and ops/performance_page.py read, so a
field keeps its name. Workloads fill them (inprocess.py, system.py); report.py writes them.
"""

import msgspec


class Row(msgspec.Struct):
    """A line of the printed table (and of the JSON's `rows`)."""

    workload: str
    measured: str
    bound: str
    ratio: str
    target: str = ""


class Percentiles(msgspec.Struct):
    """Of one figure over a run, in ms."""

    p50: float
    p90: float
    p99: float
    mean: float


class RunFigures(msgspec.Struct, kw_only=True):
    """One run of requests, in-process or over HTTP: tokens per second over the whole run, and
    latency percentiles."""

    concurrency: int
    requests: int
    input_tokens: int
    output_tokens: int
    seconds: float
    input_tok_s: float
    output_tok_s: float
    ttft_ms: Percentiles
    itl_ms: Percentiles
    latency_ms: Percentiles
    taken_ms: Percentiles  # when the server had taken the requests: for a burst, how long its arrival lasted
    last_taken_ms: float


class OfflineFigures(RunFigures, kw_only=True):
    """Workload d in-process: every request submitted at once."""

    steps: int


class LowLoadHttpFigures(RunFigures, kw_only=True):
    """Workload e over HTTP, beside its in-process twin."""

    cache_hit_tokens: int  # 0: every request was computed whole, as in-process
    added_ttft_p50_ms: float


class OfflineHttpFigures(RunFigures, kw_only=True):
    """Workload d over HTTP, beside its in-process twin."""

    ratio_to_in_process: float
    cpu_cores: dict[str, float]  # each process's CPU seconds per second of the run


class DecodeFigures(msgspec.Struct):
    """Workloads a and b: medians over the steady decode steps, against the bytes a step reads."""

    steps: int
    wall_s: float
    runner_s: float  # the launch's host time, spent while the GPU runs the step before
    gpu_s: float | None  # graph replay time from CUDA events; None without CUDA graphs
    bound_s: float
    kv_tokens: float
    weight_bytes_read: int


class PrefillFigures(msgspec.Struct):
    seconds: float
    flop: int


class HfFigures(msgspec.Struct):
    """transformers' batched generate on the same requests and weights."""

    seconds: float
    batch_size: int
    useful_tokens: int  # the output tokens the requests asked for
    generated_tokens: int  # with padding to each batch's longest output


class SystemSetup(msgspec.Struct):
    """How the whole system was started for --mode http."""

    model: str
    device: str
    flags: list[str]
    checkpoint_s: float
    startup_s: float


class FeatureCost(msgspec.Struct):
    """One feature's cost (--feature-cost): workloads a and d of the same run with every request
    using it, beside the same workloads without it."""

    feature: str
    fields: dict  # what every request set
    step_s: float  # workload a's batch-1 decode step (median)
    step_off_s: float
    output_tok_s: float  # workload d's offline throughput
    output_tok_s_off: float


class LogprobError(msgspec.Struct):
    """Our logprobs against transformers' on the same weights (`python -m ops.bench.logprob_accuracy`)."""

    reference: str  # transformers' dtype
    kind: str  # "sampled", "prompt" or "top" (the top-k alternatives' logprobs)
    count: int
    max_abs: float
    mean_abs: float


class WeightUpdateFigures(msgspec.Struct, kw_only=True):
    """One way into the live weights (`python -m ops.bench.weight_update`): whole updates of every
    weight, each from the pause of generation to its continuation, against the transport's own
    bound measured in the same run."""

    transport: str  # "nccl" (or "gloo" on a CPU), "ipc", "disk"
    tensors: int
    bytes: int
    buckets: int  # update requests per update, each a flattened bucket (disk: 1)
    pause_to_resume_s: list[float]  # per update
    load_s: list[float]  # of which the server loaded and validated (its answers' load_s, summed)
    bound_s: float  # the same bytes at the bound's rate
    bound: str  # what the bound is
    arrived: bool  # the server's checksums of weights read back are the trainer's


class StreamsThroughUpdate(msgspec.Struct, kw_only=True):
    """Streaming requests through a pause in `mode`, an update and the continue."""

    mode: str
    streams: int
    tokens_each: int
    lost: int  # streams that did not end with every token asked for
    repeated_or_missing: int  # tokens
    version_errors: int  # tokens whose version is not the weights' that computed them
    switched: int  # streams with tokens of both versions
    resumed_parts: int  # abort mode: the requests that resumed an aborted one
    pause_to_resume_s: float
    errors: list[str] = []


class SleepWakeFigures(msgspec.Struct, kw_only=True):
    """Sleep and wake cycles (`python -m ops.bench.sleep_wake`): every tag released, then resumed and
    a prompt's first token drawn. Memory as another process's `torch.cuda.mem_get_info` sees it."""

    cycles: int
    held_bytes: int  # the device memory the runner took: free before it, less free once it ran
    freed_fraction: float  # the least, over the cycles, of what sleep gave back of `held_bytes`
    asleep_torch_bytes: int  # of what stays asleep, torch's allocator's (the rest: CUDA context, kernels)
    host_bytes: int  # the weights' pinned host copy
    first_release_s: float  # the first cycle's, which allocates the host copy
    release_s: float  # median over the later cycles: the weights copied to the host, all freed
    resume_s: float  # medians: the weights restored and the pool reallocated,
    capture_s: float  # the CUDA graphs captured again,
    first_token_s: float  # then a prompt's first token
    wake_s: float  # median of the three together
    wake_max_s: float
    wakes_s: list[float]  # each cycle's, in order
    same_tokens: bool  # every cycle's greedy tokens were those drawn before the first sleep
    awake_growth_bytes: int  # the most the memory held awake grew over the first cycle's
    asleep_growth_bytes: int  # the most the memory held asleep grew over the first cycle's


class KvTierCopyFigures(msgspec.Struct, kw_only=True):
    """KV blocks between the GPU pool and host slots (`python -m ops.bench.kv_tier_copy`): saves and
    loads of scattered block sets through gpu/kv_transfer.py, against one large pinned copy of the
    same bytes between the same host memory and the device, measured in the same run. GB is 1e9 bytes."""

    block_bytes: int  # one block of every layer: one slot
    blocks: int  # per transfer
    pool_blocks: int
    host_slots: int
    host_memory: str  # "segment" (a HostSegment in /dev/shm, registered) or "pinned" (torch's pinned memory)
    save_gb_s: float  # medians over the transfers: GPU to host,
    load_gb_s: float  # host to GPU
    saves_gb_s: list[float]  # each transfer's, in order
    loads_gb_s: list[float]
    ceiling_save_gb_s: float  # the one large pinned copy, device to host (median)
    ceiling_load_gb_s: float  # and host to device
    same_blocks: bool  # every transfer's blocks, loaded back into other blocks, equal those saved


class KvTierFigures(msgspec.Struct, kw_only=True):
    """The KV tiers against recompute through the whole server (`python -m ops.bench.kv_tiers`): the
    same requests on a server with the host and disk tiers and on one without, in turn."""

    kv_blocks: int  # the GPU pool, both servers
    working_set_tokens: int  # of the multi-turn chats
    multi_turn_tokens_s_on: float  # prompt and output tokens per second, rounds after the first
    multi_turn_tokens_s_off: float
    host_hit_ttft_s: list[float]  # a prefix the pool evicted and the host holds, each repeat
    fresh_ttft_s: list[float]  # a prompt as long never seen, same server
    # The same prefix while the pool still held it, same server: what a host hit adds is its load.
    gpu_hit_ttft_s: list[float] = []
    cold_tokens_s_on: list[float]  # random prompts, never a hit: a round per repeat, each of new prompts
    cold_tokens_s_off: list[float]
    # After a whole-server restart, page cache kept then dropped: the TTFT of a prompt computed
    # before it, of one as long never seen, and the blocks read back from the disk tier.
    restart_ttft_s: list[float]
    restart_recompute_ttft_s: list[float]
    restart_fetched_blocks: list[int]
    restart_same_tokens: bool  # greedy output after each restart equals the one before
    # The disk's own read of the bytes the restore read, page cache dropped (ops.bench.kv_tiers.cold_read_s).
    restart_disk_read_s: float = 0.0
    restart_disk_read_bytes: int = 0


class RunIdentity(msgspec.Struct):
    """Where the figures came from: the command, its commit, when, the device and the software."""

    command: str
    commit: str
    date: str
    model: str
    device: str
    software: dict[str, str]


class KvSharedChainFigures(msgspec.Struct, kw_only=True):
    """A session's KV moving to another machine through JetStream's object store
    (`python -m ops.bench.kv_shared_chains`): two servers on one external NATS, each with its own
    data dir and disk tier."""

    prompt_tokens: int
    moved_ttft_s: float  # the prompt again, on the second server, once its chains were pulled
    recompute_ttft_s: float  # a prompt as long never seen, on the second server
    disk_hit_blocks: int  # the second server's disk tier's hits
    pulled_bytes: int  # the second server's pull from the bucket into its disk
    pull_s: float
    put_bytes: int  # the first server's puts, as its bucket lane logged them
    put_s: float
    puts_done_after_s: float  # from the first server's disk tier settling to the bucket holding the prompt


class Details(msgspec.Struct, omit_defaults=True, rename="kebab"):
    """Per workload, those the run measured (the rest are left out of the JSON); `d_hf` is the key
    `d-hf`, and so on. In the order a run fills them."""

    run: RunIdentity | None = None
    a: DecodeFigures | None = None
    b: DecodeFigures | None = None
    c: PrefillFigures | None = None
    e: RunFigures | None = None
    d: OfflineFigures | None = None
    d_hf: HfFigures | None = None
    system: SystemSetup | None = None
    e_http: LowLoadHttpFigures | None = None
    e_ids_http: LowLoadHttpFigures | None = None
    d_http: OfflineHttpFigures | None = None
    sweep: list[RunFigures] | None = None
    feature_cost: list[FeatureCost] | None = None
    logprob_error: list[LogprobError] | None = None
    weight_update: list[WeightUpdateFigures] | None = None
    update_streams: list[StreamsThroughUpdate] | None = None
    sleep_wake: SleepWakeFigures | None = None
    kv_tier_copy: KvTierCopyFigures | None = None
    kv_tiers: KvTierFigures | None = None
    kv_shared_chains: KvSharedChainFigures | None = None
