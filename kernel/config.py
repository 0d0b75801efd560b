"""One configuration for the whole deployment, shared by the supervisor and every actor.

Values come from CLI flags, then the environment (`KERNEL_<FIELD>`), then an optional TOML file
(`--config`), then the defaults below. The supervisor hands its settings to each child as flags,
so an actor started by hand on another machine takes exactly the same flags.
"""

import argparse
import os
import tomllib
import typing
from typing import Annotated, Any

import msgspec

from kernel.model_source import DEFAULT_MODEL, DEMO_MODEL

MAX_NATS_PAYLOAD_BYTES = 64 * 1024 * 1024  # nats-server refuses to start with a larger max_payload


class KernelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    nats_url: str | None = None
    nats_credentials: str | None = None
    namespace: str = "llm"
    bus_max_payload_bytes: Annotated[int, msgspec.Meta(gt=0, le=MAX_NATS_PAYLOAD_BYTES)] = 1024 * 1024
    data_dir: str = ".kernel"
    model: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"
    dtype: str = "auto"
    attention_backend: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_num_seqs: int = 256
    tokenizers: int = 1
    max_prefill_tokens: int = 2048
    prefix_caching: bool = True
    public_prefix_tenants: int = 5
    public_prefix_window_s: float = 3600.0
    session_budget_tokens: int | None = None
    max_restarts: int = 5
    restart_period_s: float = 60.0
    request_timeout_s: float = 600.0
    max_migrations: int = 3
    api_keys: str | None = None
    admin_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    max_concurrent_requests: int = 2048
    busy_poll_ms: Annotated[float, msgspec.Meta(ge=0, le=60_000)] | None = None
    log_format: str = "json"
    log_level: str = "info"

    @property
    def model_name(self) -> str:
        """The name clients use in the `model` field."""
        if self.served_model_name:
            return self.served_model_name
        return os.path.basename(os.path.normpath(self.model or DEFAULT_MODEL))


HELP = {
    "nats_url": "use this NATS server instead of starting an embedded one (e.g. nats://host:4222)",
    "nats_credentials": 'a JSON file {"user": ..., "password": ...} to connect to the NATS server with; the '
                        "supervisor writes one per actor under <data-dir>/bus/ for its embedded server",
    "namespace": "subject prefix, so several deployments can share one NATS cluster",
    "bus_max_payload_bytes": "the largest message the embedded NATS server takes (its max_payload, at most 64 MiB; "
                             "an external server has its own): a prompt crosses the bus whole, at up to 5 bytes a "
                             "token, and a longer one gets 400",
    "data_dir": "where the embedded server, converted and built models and other state live",
    "model": "a Hugging Face model directory (Llama, Qwen2, Qwen3, Mistral), a .gguf file of one (converted once "
             f"into <data-dir>/models/), or a built-in name: {DEFAULT_MODEL}, a small real chat model and what "
             f"None serves, or {DEMO_MODEL}, random weights for tests and benchmarks",
    "served_model_name": "the model name clients send; default: the built-in name, the .gguf file's name without "
                         "the suffix, or the model directory's name",
    "host": "HTTP listen address",
    "port": "HTTP listen port",
    "device": "cpu, cuda, cuda:N, or auto (cuda when available)",
    "dtype": "float32, bfloat16, float16, or auto (float32 on CPU, bfloat16 on CUDA)",
    "attention_backend": "auto (FlashInfer on CUDA where installed and it fits, else our Triton kernels; torch on CPU), "
                         "flashinfer, triton or torch",
    "max_model_len": "context window in tokens (prompt + output); default: the model's",
    "block_size": "tokens per KV cache block",
    "num_kv_blocks": "KV cache blocks to allocate; default: sized from free memory",
    "max_num_seqs": "most sequences in the running batch",
    "tokenizers": "tokenizer processes, sharing the work as a NATS queue group",
    "max_prefill_tokens": "prompt tokens computed per step (chunked prefill budget)",
    "public_prefix_tenants": "a cached prefix becomes public (shared by all tenants) once this many tenants sent it "
                             "within --public-prefix-window-s (README: what that reveals)",
    "public_prefix_window_s": "the window for --public-prefix-tenants",
    "prefix_caching": "keep computed KV blocks in the radix cache for later requests to reuse (--no-prefix-caching: off)",
    "session_budget_tokens": "KV tokens that open sessions may keep pinned in the cache, all together; past it their "
                             "oldest pins become evictable like any cached prefix (default: half the KV cache)",
    "max_restarts": "restarts of one actor allowed within --restart-period-s before giving up",
    "restart_period_s": "the window for --max-restarts",
    "request_timeout_s": "a request that takes longer fails with a retriable error",
    "max_body_bytes": "HTTP request bodies larger than this get 413",
    "max_concurrent_requests": "requests in flight per frontdoor beyond this get 429 with Retry-After",
    "busy_poll_ms": "after each bus message they send or receive, the actors on a request's path (frontdoor, "
                    "gateway, tokenizer, scheduler, executor on CUDA) poll the bus this long instead of sleeping: "
                    "each bus hop is about 0.1 ms quicker, for a core each while requests flow (default: 50 where the "
                    "model runs on a GPU and the machine has at least 8 cores, else 0; at most 60000)",
    "api_keys": "a JSON file mapping each API key to its tenant; with it, HTTP requests need a key and bus "
                "clients their tenant's credentials (<data-dir>/bus/tenants/)",
    "admin_key": "the key for /admin/ routes (with --api-keys, required for them); on the bus, admin.json's user",
    "max_migrations": "times a request may move to a restarted scheduler or tokenizer before it fails (retriable)",
    "log_format": "json (one object per line) or console (human-readable)",
    "log_level": "debug, info, warning or error",
}
CHOICES = {
    "log_format": ["json", "console"],
    "log_level": ["debug", "info", "warning", "error"],
    "dtype": ["auto", "float32", "bfloat16", "float16"],
    "attention_backend": ["auto", "flashinfer", "triton", "torch"],
}
ENV_PREFIX = "KERNEL_"


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per config field; every default is None so we can tell what was given."""
    parser.add_argument("--config", metavar="TOML", help="read settings from a TOML file")
    for field in msgspec.structs.fields(KernelConfig):
        help_text = f"{HELP[field.name]} (default: {field.default})"
        if field.type is bool:  # --name / --no-name
            parser.add_argument(_flag(field.name), dest=field.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
            continue
        parser.add_argument(
            _flag(field.name),
            dest=field.name,
            type=_scalar_type(field.type),
            default=None,
            choices=CHOICES.get(field.name),
            help=help_text,
        )


def _scalar_type(annotation: Any) -> type:
    """int for `int`, `int | None` and `Annotated[int, ...] | None`, and so on."""
    members = typing.get_args(annotation) or (annotation,)
    members = [typing.get_args(m)[0] if typing.get_origin(m) is Annotated else m for m in members]
    return next(t for t in (int, float, str) if t in members)


def from_args(args: argparse.Namespace) -> KernelConfig:
    """Flags win over the environment, which wins over the TOML file."""
    values: dict[str, Any] = {}
    if getattr(args, "config", None):
        with open(args.config, "rb") as f:
            values.update(tomllib.load(f))
    for field in KernelConfig.__struct_fields__:
        env = os.environ.get(ENV_PREFIX + field.upper())
        if env is not None:
            values[field] = env
        given = getattr(args, field, None)
        if given is not None:
            values[field] = given
    try:
        return msgspec.convert(values, KernelConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise SystemExit(f"invalid configuration: {exc}") from None


def to_argv(config: KernelConfig) -> list[str]:
    """The flags that reproduce `config` in a child process (defaults are left out)."""
    argv: list[str] = []
    defaults = KernelConfig()
    for field in KernelConfig.__struct_fields__:
        value = getattr(config, field)
        if isinstance(value, bool):
            argv += [] if value == getattr(defaults, field) else [_flag(field) if value else "--no-" + _flag(field)[2:]]
        elif value is not None and value != getattr(defaults, field):
            argv += [_flag(field), str(value)]
    return argv
