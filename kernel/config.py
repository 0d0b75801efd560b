"""One configuration for the whole deployment, shared by the supervisor and every actor, grouped
by component (`config.bus`, `config.engine`, ...) while each setting stays one flat flag.

Each field declares its range or choices here; kernel/config_flags.py reads the values from flags,
the environment and TOML and checks every one against them.
"""

import os
from typing import Annotated, Literal

import msgspec

from kernel.model_source import DEFAULT_MODEL

MAX_NATS_PAYLOAD_BYTES = 64 * 1024 * 1024  # nats-server refuses to start with a larger max_payload
MAX_DISK_KV_GB = 1e6  # a petabyte: any real disk, and never infinity, which no byte count holds


# Ranges shared by several settings; msgspec checks each value against its own, whatever its source.
AtLeastOne = Annotated[int, msgspec.Meta(ge=1)]
AtLeastZero = Annotated[int, msgspec.Meta(ge=0)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
# bus_auth builds every permission from the namespace, so it must be plain subject tokens (no wildcards).
SUBJECT_TOKENS = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"


class BusConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The NATS bus: which server, as whom, under which subjects, and how actors wait on it."""

    nats_url: Annotated[str, msgspec.Meta(pattern=r"^\S+$")] | None = None
    nats_credentials: NonEmpty | None = None
    namespace: Annotated[str, msgspec.Meta(pattern=SUBJECT_TOKENS)] = "llm"
    bus_max_payload_bytes: Annotated[int, msgspec.Meta(gt=0, le=MAX_NATS_PAYLOAD_BYTES)] = 1024 * 1024
    busy_poll_ms: Annotated[float, msgspec.Meta(ge=0, le=60_000)] | None = None


class EngineConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The model and how the scheduler and executor run it."""

    model: NonEmpty | None = None
    served_model_name: NonEmpty | None = None
    device: Annotated[str, msgspec.Meta(pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attention_backend: Literal["auto", "flashinfer", "triton", "torch"] = "auto"
    deterministic: bool = False
    max_model_len: AtLeastOne | None = None
    block_size: AtLeastOne = 16
    num_kv_blocks: AtLeastOne | None = None
    max_num_seqs: AtLeastOne = 256
    max_prefill_tokens: AtLeastOne = 2048
    prefix_caching: bool = True
    host_kv_blocks: AtLeastZero = 0
    disk_kv_gb: Annotated[float, msgspec.Meta(ge=0, le=MAX_DISK_KV_GB)] = 0.0
    disk_kv_dir: NonEmpty | None = None
    session_budget_tokens: AtLeastZero | None = None
    step_deadline_s: PositiveSeconds = 120.0
    weight_version: NonEmpty = "default"
    weight_group_join_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=600)] = 300.0
    embedding_pooling: Literal["last", "mean"] = "last"

    def tier_conflict(self) -> str | None:
        """Why the KV tiers' flags cannot work together, or None: each tier keeps what leaves the
        one above it, so it has nothing to keep without that one."""
        if self.host_kv_blocks and not self.prefix_caching:
            return "--host-kv-blocks keeps the prefix cache's blocks: leave out --no-prefix-caching"
        if self.disk_kv_gb and not self.host_kv_blocks:
            return "--disk-kv-gb keeps the blocks of the host tier: give --host-kv-blocks too"
        return None

    @property
    def model_name(self) -> str:
        """The name clients use in the `model` field."""
        if self.served_model_name:
            return self.served_model_name
        return os.path.basename(os.path.normpath(self.model or DEFAULT_MODEL))


class HttpConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The frontdoor's HTTP server."""

    host: NonEmpty = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 8000
    max_body_bytes: AtLeastOne = 4 * 1024 * 1024
    max_concurrent_requests: AtLeastOne = 2048
    incremental_streaming_output: bool = False


class ChatConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How chat replies are read: tool calls and thinking."""

    tool_call_parser: Literal["auto", "hermes", "qwen25", "qwen", "qwen3", "llama3_json", "llama3", "mistral"] = "auto"
    reasoning_parser: Literal["none", "deepseek-r1", "deepseek_r1", "qwen3"] = "none"


class RequestsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How long the origins (frontdoor, gateway) keep a request alive."""

    request_timeout_s: PositiveSeconds = 600.0
    max_migrations: AtLeastZero = 3


class TenancyConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Who asks, and what tenants share of the prefix cache."""

    api_keys: NonEmpty | None = None
    admin_key: NonEmpty | None = None
    public_prefix_tenants: AtLeastOne = 5
    public_prefix_window_s: PositiveSeconds = 3600.0


class SupervisionConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the supervisor starts, where it keeps state, and how often a child may restart."""

    data_dir: NonEmpty = ".kernel"
    session_store: Literal["auto", "files", "jetstream"] = "auto"
    tokenizers: AtLeastOne = 1
    max_restarts: AtLeastZero = 5
    restart_period_s: PositiveSeconds = 60.0


class LoggingConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Every process's log lines."""

    log_format: Literal["json", "console"] = "json"
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class KernelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole deployment's settings, one sub-struct per component; field names are unique across
    them, so each stays one flag (`--max-num-seqs` is `engine.max_num_seqs`)."""

    bus: BusConfig = msgspec.field(default_factory=BusConfig)
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    chat: ChatConfig = msgspec.field(default_factory=ChatConfig)
    requests: RequestsConfig = msgspec.field(default_factory=RequestsConfig)
    tenancy: TenancyConfig = msgspec.field(default_factory=TenancyConfig)
    supervision: SupervisionConfig = msgspec.field(default_factory=SupervisionConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
