"""Every setting of kernel/config.py as a flag, with its help, and where the values come from.

Values come from CLI flags, then the environment (`KERNEL_<FIELD>`), then an optional TOML file
(`--config`), then the config's defaults; each is checked against its field's range or choices as
it is read, so a bad value stops the program before anything starts. The supervisor hands its
settings to each child as flags, so an actor started by hand on another machine takes exactly the
same flags.
"""

import argparse
import os
import tomllib
import typing
from collections.abc import Callable, Iterator
from typing import Any, Literal

import msgspec

from kernel.config import KernelConfig
from kernel.model_source import DEFAULT_MODEL, DEMO_MODEL

HELP = {
    "nats_url": "use this NATS server instead of starting an embedded one (e.g. nats://host:4222)",
    "nats_credentials": 'a JSON file {"user": ..., "password": ...} to connect to the NATS server with; the '
    "supervisor writes one per actor under <data-dir>/bus/ for its embedded server",
    "namespace": "subject prefix, so several deployments can share one NATS cluster",
    "bus_max_payload_bytes": "the largest message the embedded NATS server takes (its max_payload, at most 64 MiB; "
    "an external server has its own): a prompt crosses the bus whole, at up to 5 bytes a "
    "token, and a longer one gets 400",
    "data_dir": "where the embedded server, converted and built models and other state live",
    "session_store": "where the snapshot actor keeps sessions for restarts: files (under <data-dir>/sessions/), "
    "jetstream (a key-value bucket of the NATS server, one per --namespace: a server of the namespace started on "
    "another machine on that NATS continues them; files, with a warning, where the server has no JetStream), "
    "or auto: jetstream with --nats-url, files under the embedded server",
    "model": "a Hugging Face model directory (Llama, Qwen2, Qwen3, Mistral), a .gguf file of one (converted once "
    f"into <data-dir>/models/), or a built-in name: {DEFAULT_MODEL}, a small real chat model and the "
    f"default, or {DEMO_MODEL}, random weights for tests and benchmarks",
    "served_model_name": "the model name clients send; default: the built-in name, the .gguf file's name without "
    "the suffix, or the model directory's name",
    "host": "HTTP listen address",
    "port": "HTTP listen port",
    "device": "cpu, cuda, cuda:N, or auto (cuda when available)",
    "dtype": "float32, bfloat16, float16, or auto (float32 on CPU, bfloat16 on CUDA)",
    "attention_backend": "auto (FlashInfer on CUDA where installed and it fits, else our Triton kernels; torch on CPU), "
    "flashinfer, triton or torch",
    "deterministic": "compute with batch-invariant kernels (matrix products, attention, norms): a request's tokens "
    "and logprobs are the same bits alone or in any batch, however its prompt was chunked or cached, after a "
    "preemption or a restart; on the same GPU model with the same versions (docs/api.md, determinism). Costs "
    "speed; needs --attention-backend auto",
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
    "host_kv_blocks": "KV blocks the host tier keeps in shared memory (/dev/shm) beside the GPU pool: blocks the "
    "prefix cache stores are copied there, and a prompt whose prefix left the GPU loads it back instead of "
    "recomputing it (0: off; needs --prefix-caching)",
    "disk_kv_gb": "gigabytes of block files the disk tier keeps under --disk-kv-dir: every block the host tier holds "
    "is written there, so what leaves the host stays on disk, and a prompt whose prefix is on disk reads it back "
    "instead of recomputing it, also after a restart (0: off; needs --host-kv-blocks)",
    "disk_kv_dir": "the disk tier's directory (default: kv-blocks under --data-dir)",
    "session_budget_tokens": "KV tokens that open sessions may keep pinned in the cache, all together; past it their "
    "oldest pins become evictable like any cached prefix (default: half the KV cache)",
    "step_deadline_s": "a step of the executor not done within this is taken for hung: the executor reports itself "
    "stuck, /health/ready answers 503, and the supervisor restarts it (generous: a large prompt chunk "
    "on a slow device takes seconds)",
    "weight_version": "the version of the weights the executor loads at start, on every output until an update "
    "names another (SGLang's --weight-version)",
    "weight_group_join_timeout_s": "how long /init_weights_update_group waits for every rank of the trainer's group "
    "to join before it fails; the executor runs no step meanwhile (at most 600 s)",
    "embedding_pooling": "how an embedding (/v1/embeddings, /encode, the bus) pools the prompt's final hidden "
    "states: last (the last token's, as vLLM and SGLang embed with a causal LM) or mean (of every token's)",
    "max_restarts": "restarts of any one child allowed within --restart-period-s before the supervisor gives up and "
    "stops everything; each actor process, each tokenizer replica and the embedded nats-server "
    "counts its own",
    "restart_period_s": "the window for --max-restarts",
    "tool_call_parser": "the format of the model's tool calls: hermes (<tool_call> JSON: Qwen2.5, Qwen3, Hermes; "
    "qwen25, qwen and qwen3 say the same), llama3_json (llama3), mistral, or auto: read from the chat template "
    "(docs/api.md, tool calls)",
    "reasoning_parser": "moves a reply's <think>...</think> into reasoning_content: qwen3, deepseek-r1 (a reply "
    "starts thinking unless the prompt closed it), or none",
    "request_timeout_s": "a request that takes longer fails with a retriable error",
    "max_body_bytes": "HTTP request bodies larger than this get 413",
    "max_concurrent_requests": "requests in flight per frontdoor beyond this get 429 with Retry-After",
    "incremental_streaming_output": "SGLang's: each event of a streamed /generate carries only what is new (by "
    "default each repeats everything so far, as SGLang's do, which costs the square of the output's length)",
    "busy_poll_ms": "after each bus message they send or receive, the actors on a request's path (frontdoor, "
    "gateway, tokenizer, scheduler, executor on CUDA) poll the bus this long instead of sleeping: "
    "each bus hop skips a wake-up, for a core each while requests flow (default: 50 where the "
    "model runs on a GPU and the machine has at least 8 cores, else 0; at most 60000)",
    "api_keys": "a JSON file mapping each API key to its tenant; with it, HTTP requests need a key and bus "
    "clients their tenant's credentials (<data-dir>/bus/tenants/)",
    "admin_key": "the key for /admin/ routes (with --api-keys, required for them); on the bus, admin.json's user",
    "max_migrations": "times a request may move to a restarted scheduler or tokenizer before it fails (retriable)",
    "log_format": "json (one object per line) or console (human-readable)",
    "log_level": "debug, info, warning or error",
}
ENV_PREFIX = "KERNEL_"


class ConfigError(SystemExit):
    """A setting from the environment or the TOML file outside its range or choices. A SystemExit,
    so a caller that lets it pass still exits with the message; `parse` makes it a usage error."""


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _choices(annotation: Any) -> tuple[str, ...]:
    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()


def _check(field: msgspec.structs.FieldInfo, value: Any) -> Any:
    """`value` as the field's type, or ValueError saying, in argparse's words, what is wrong.
    None is left out of the type: no flag, variable or TOML value can give it."""
    members = typing.get_args(field.type)
    value_type = next(m for m in members if m is not type(None)) if type(None) in members else field.type
    try:
        return msgspec.convert(value, value_type, strict=False)
    except msgspec.ValidationError as exc:
        if choices := _choices(field.type):
            raise ValueError(f"invalid choice: {value!r} (choose from {', '.join(map(repr, choices))})") from None
        reason = str(exc)
        if isinstance(value, str):  # every flag and environment value is text: "got `str`" says nothing
            reason = reason.removesuffix(", got `str`")
        raise ValueError(f"invalid value: {value!r} ({reason[0].lower()}{reason[1:]})") from None


def _flag_type(field: msgspec.structs.FieldInfo) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return _check(field, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None  # argparse names the flag

    return convert


def _setting(field: msgspec.structs.FieldInfo, value: Any, source: str) -> Any:
    try:
        return _check(field, value)
    except ValueError as exc:
        raise ConfigError(f"invalid configuration: {source} ({_flag(field.name)}): {exc}") from None


def _settings() -> Iterator[tuple[str, msgspec.structs.FieldInfo]]:
    """(group, field) for every setting, in the order of KernelConfig and its sub-structs."""
    for group in msgspec.structs.fields(KernelConfig):
        for field in msgspec.structs.fields(group.type):
            yield group.name, field


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per setting, under a heading per component; every default is None so we can
    tell what was given."""
    parser.add_argument("--config", metavar="TOML", help="read settings from a TOML file")
    headings = {
        group.name: parser.add_argument_group(group.name, group.type.__doc__)
        for group in msgspec.structs.fields(KernelConfig)
    }
    for group, field in _settings():
        # A setting whose default is None says in its help what happens without it.
        help_text = HELP[field.name] if field.default is None else f"{HELP[field.name]} (default: {field.default})"
        if field.type is bool:  # --name / --no-name
            headings[group].add_argument(
                _flag(field.name), dest=field.name, default=None, help=help_text, action=argparse.BooleanOptionalAction
            )
            continue
        headings[group].add_argument(
            _flag(field.name),
            dest=field.name,
            type=_flag_type(field),
            default=None,
            choices=_choices(field.type) or None,
            help=help_text,
        )


def from_args(args: argparse.Namespace) -> KernelConfig:
    """Flags win over the environment, which wins over the TOML file (flat: one key per flag). The
    flags were checked as argparse read them; a bad value from the other two raises ConfigError."""
    settings = {field.name: (group, field) for group, field in _settings()}
    groups = {group.name: group.type for group in msgspec.structs.fields(KernelConfig)}
    values: dict[str, dict[str, Any]] = {group: {} for group in groups}
    toml = _read_toml(args.config) if getattr(args, "config", None) else {}
    for key, value in toml.items():
        if key not in settings:
            raise ConfigError(f"invalid configuration: {args.config}: unknown setting {key!r}")
        group, field = settings[key]
        values[group][key] = _setting(field, value, f"{args.config}: {key}")
    for name, (group, field) in settings.items():
        env = os.environ.get(ENV_PREFIX + name.upper())
        if env is not None:
            values[group][name] = _setting(field, env, ENV_PREFIX + name.upper())
        given = getattr(args, name, None)
        if given is not None:
            values[group][name] = given
    config = KernelConfig(**{group: struct(**values[group]) for group, struct in groups.items()})
    if (conflict := config.engine.tier_conflict()) is not None:
        raise ConfigError(f"invalid configuration: {conflict}")
    return config


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"invalid configuration: --config {path}: {exc}") from None


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> tuple[KernelConfig, argparse.Namespace]:
    """The entry points' parse: a value out of range or choices, from any source, is argparse's
    usage error (exit 2) naming its flag, before anything starts."""
    args = parser.parse_args(argv)
    try:
        return from_args(args), args
    except ConfigError as exc:
        parser.error(str(exc))


def to_argv(config: KernelConfig) -> list[str]:
    """The flags that reproduce `config` in a child process (defaults are left out)."""
    argv: list[str] = []
    for group, field in _settings():
        value = getattr(getattr(config, group), field.name)
        if isinstance(value, bool):
            argv += [] if value == field.default else [_flag(field.name) if value else "--no-" + _flag(field.name)[2:]]
        elif value is not None and value != field.default:
            argv += [_flag(field.name), str(value)]
    return argv
