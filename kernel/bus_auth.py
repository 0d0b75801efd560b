"""Who may say what on the bus: one NATS user per actor, allowed only the subjects of that actor,
and users for other services: without API keys one `client` user, which the network is trusted
with as over HTTP; with keys one user per tenant, on its own subjects and inboxes alone. An admin
key adds an `admin` user, then the only service user that may call the admin subjects. The
supervisor writes every user's credential file and the embedded nats-server's config into
`<data_dir>/bus/`; a process needs only its credential file.
"""

import json
import os
import secrets
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import msgspec

from kernel.subjects import Subjects

BUS_DIR = "bus"
TENANTS_DIR = "tenants"  # a credential file per tenant, named after it: the file to hand to each
SERVER_CONFIG = "nats-server.conf"
CLIENT_INBOX = "_INBOX"  # nats-py's default inbox prefix, the `client` user's
TENANT = "tenant"  # tenant users are `tenant.<name>`, so no tenant name can be an actor's
ADMIN = "admin"
# NATS micro services' PING, INFO and STATS, which every actor answers (kernel/bus_service.py)
SERVICE_DISCOVERY = "$SRV.>"


class BusCredentials(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A credential file, as JSON: `{"user": ..., "password": ...}`."""

    user: str
    password: str
    # Where this user's reply inboxes live (nats-py's `inbox_prefix`): each user has its own, which
    # no other user may read. None (in files for an external server): nats-py's default, `_INBOX`.
    inbox_prefix: str | None = None


class CredentialsError(Exception):
    """A credential file that cannot be read or is not a user and password."""


@dataclass(frozen=True)
class Grant:
    publish: list[str]
    subscribe: list[str]
    answers_requests: bool = False  # may send one reply to each request it receives (`allow_responses`)


def tenant_user(tenant: str) -> str:
    return f"{TENANT}.{tenant}"


def discovery(actor: str) -> list[str]:
    """What an actor subscribes to to answer NATS's service discovery: each verb for every service,
    for its kind, and for its own instance."""
    return ["$SRV.*", f"$SRV.*.{actor}", f"$SRV.*.{actor}.*"]


def key_value_bucket(bucket: str) -> list[str]:
    """What a user publishes to use one JetStream key-value bucket, and no other stream: bind or
    make it, get, put and delete keys, and list them (an ordered consumer of the stream, delivered
    to the user's own inbox)."""
    stream = f"KV_{bucket}"
    return [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.FC.{stream}.>",
        f"$KV.{bucket}.>",
    ]


def grants(s: Subjects, tenants: Collection[str] | None = None, admin: bool = False) -> dict[str, Grant]:
    """What each user may publish and subscribe to: the one table to extend with a new actor.
    Every user may also subscribe to its own inbox (see `inbox_prefix`). `tenants`: the tenants of
    the API keys, None without keys; `admin`: whether an admin key is set."""
    keyed = tenants is not None
    # With keys, the gateway and the scheduler serve only the per-tenant subjects, whose last token
    # is the tenant: a tenant's user may publish only on its own, so none can speak for another.
    generate, sessions = (s.tenant_generate("*"), s.tenant_sessions("*")) if keyed else (s.generate, s.sessions)
    public_inboxes = f"{inbox_prefix(s.namespace, TENANT)}.>" if keyed else f"{CLIENT_INBOX}.>"
    admin_subjects = f"{s.namespace}.admin.>"
    table = {
        "executor": Grant(
            publish=[s.step_outputs, s.executor_info, s.heartbeat("executor")],
            subscribe=[s.executor_commands, s.executor_describe, s.executor_weights, *discovery("executor")],
            answers_requests=True,
        ),
        "scheduler": Grant(
            # origins: the end of a waiting request aborted with its output kept
            # snapshot: every change to a session, and the restore at start
            publish=[
                s.executor_commands,
                s.executor_describe,
                s.origin("*"),
                s.snapshot_sessions,
                s.cache_tier,
                s.heartbeat("scheduler"),
            ],
            subscribe=[
                s.scheduler,
                s.scheduler_weights,
                sessions,
                s.executor_info,
                s.step_outputs,
                s.admin_stats,
                s.admin_flush_cache,
                s.admin_cache,
                s.admin_publish,
                s.admin_pause,
                s.admin_continue,
                s.admin_pause_state,
                s.admin_weights,
                s.heartbeat("frontdoor"),
                s.heartbeat("gateway"),
                s.heartbeat("snapshot"),  # a restarted snapshot actor gets every session again
                s.heartbeat("cache_tier"),  # a restarted cache_tier moves none of the slots the last one had
                *discovery("scheduler"),
            ],
            answers_requests=True,
        ),
        "cache_tier": Grant(
            publish=[s.heartbeat("cache_tier")],
            subscribe=[s.cache_tier, *discovery("cache_tier")],
            answers_requests=True,
        ),
        "snapshot": Grant(
            publish=[s.heartbeat("snapshot"), *key_value_bucket(s.sessions_bucket)],
            subscribe=[s.snapshot_sessions, *discovery("snapshot")],
            answers_requests=True,
        ),
        "weight_sync": Grant(
            # The transaction: the scheduler's pause and cache, the executor's weights; a rename's AbortAll.
            publish=[
                s.admin_pause,
                s.admin_continue,
                s.admin_pause_state,
                s.admin_stats,
                s.admin_flush_cache,
                s.scheduler,
                s.scheduler_weights,
                s.executor_weights,
                s.executor_describe,
                s.heartbeat("weight_sync"),
            ],
            subscribe=[s.admin_weights, s.executor_info, *discovery("weight_sync")],
            answers_requests=True,
        ),
        "tokenizer": Grant(
            publish=[s.scheduler, s.origin("*"), s.heartbeat("tokenizer")],
            subscribe=[s.tokenizer, s.tokenizer_untrack, s.step_outputs, *discovery("tokenizer")],
            answers_requests=True,
        ),
        "gateway": Grant(
            # A stream is many replies, sent again to a new inbox on resume and after a bus outage
            # (which forgets one-reply grants): the gateway may publish to every client's (tenant's) inbox.
            publish=[s.tokenizer, s.tokenizer_untrack, s.scheduler, s.heartbeat("gateway"), public_inboxes],
            # steps: requests without text; metrics: the frontdoor's /metrics asks every origin
            subscribe=[
                generate,
                s.origin("*"),
                s.all_heartbeats,
                s.step_outputs,
                s.metrics_origins,
                *discovery("gateway"),
            ],
            answers_requests=True,
        ),
        "frontdoor": Grant(
            publish=[
                s.tokenizer,
                s.tokenizer_untrack,
                s.scheduler,
                s.admin_stats,
                s.admin_flush_cache,
                s.admin_cache,
                s.admin_publish,
                s.admin_pause,
                s.admin_continue,
                s.admin_pause_state,
                s.admin_weights,  # the weight routes and the version in the info routes (weight_sync answers)
                s.executor_describe,  # /metrics: the executor's steps and weight version
                s.metrics_origins,  # /metrics: every origin's request figures
                s.heartbeat("frontdoor"),
            ],
            # steps: requests without text; metrics: every frontdoor is an origin /metrics asks
            subscribe=[s.origin("*"), s.all_heartbeats, s.step_outputs, s.metrics_origins, *discovery("frontdoor")],
            answers_requests=True,
        ),
        "supervisor": Grant(publish=[], subscribe=[s.all_heartbeats]),
    }
    if keyed:
        table |= {
            tenant_user(t): Grant(publish=[s.tenant_generate(t), s.tenant_sessions(t)], subscribe=[])
            for t in sorted(tenants)
        }
    else:  # as over HTTP, the admin subjects are open without keys until an admin key closes them
        # Service discovery shows every actor's subjects and counts: open or closed with the admin subjects.
        admin_only = [] if admin else [admin_subjects, SERVICE_DISCOVERY]
        table["client"] = Grant(publish=[s.generate, s.sessions, *admin_only], subscribe=[])
    if admin:
        table[ADMIN] = Grant(publish=[admin_subjects, SERVICE_DISCOVERY], subscribe=[])
    return table


def inbox_prefix(namespace: str, user: str) -> str:
    """Users receive replies under `<ns>.inbox.<user>`, each only its own; the `client` user,
    which every service shares without keys, keeps nats-py's default."""
    return CLIENT_INBOX if user == "client" else f"{namespace}.inbox.{user}"


def credentials_path(data_dir: Path, user: str) -> Path:
    kind, _, tenant = user.partition(".")
    if kind == TENANT and tenant:
        return Path(data_dir) / BUS_DIR / TENANTS_DIR / f"{tenant}.json"
    return Path(data_dir) / BUS_DIR / f"{user}.json"


def load_credentials(path: str | Path) -> BusCredentials:
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=BusCredentials)
    except OSError as exc:
        raise CredentialsError(f"cannot read {path}: {exc.strerror}") from None
    except msgspec.DecodeError as exc:
        raise CredentialsError(f'{path} is not a credential file ({{"user": ..., "password": ...}}): {exc}') from None


def prepare(
    data_dir: Path,
    namespace: str,
    max_payload: int | None = None,
    tenants: Collection[str] | None = None,
    admin: bool = False,
) -> Path:
    """Makes sure every user of `grants(..., tenants, admin)` has credentials in `<data_dir>/bus/`
    (reusing those already there, so running actors and clients keep working across restarts),
    removes the files of users no longer in the table (a tenant whose keys went), and writes the
    server config, with the largest message the server takes (its own default if None); returns
    the config's path."""
    bus_dir = Path(data_dir) / BUS_DIR
    table = grants(Subjects(namespace), tenants, admin)
    paths = {user: credentials_path(data_dir, user) for user in table}
    for folder in sorted({bus_dir, *(path.parent for path in paths.values())}):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)
    users = {user: _ensure_credentials(path, user, namespace) for user, path in paths.items()}
    _remove_other_files(bus_dir, set(paths.values()))
    config = bus_dir / SERVER_CONFIG
    server = server_config(users, table)
    if max_payload is not None:
        server["max_payload"] = max_payload
    _write_private(config, json.dumps(server, indent=2))
    return config


def server_config(users: dict[str, BusCredentials], table: dict[str, Grant]) -> dict:
    """The nats-server config (its format reads JSON): one user per entry, with its permissions."""
    entries = []
    for user, credentials in users.items():
        grant = table[user]
        subscribe = list(dict.fromkeys([*grant.subscribe, f"{credentials.inbox_prefix}.>"]))
        # Nothing to publish is said as a deny of everything, never as an empty (easily misread) allow list.
        publish = {"allow": grant.publish} if grant.publish else {"deny": [">"]}
        permissions = {"publish": publish, "subscribe": {"allow": subscribe}}
        if grant.answers_requests:
            permissions["allow_responses"] = True
        entries.append({"user": credentials.user, "password": credentials.password, "permissions": permissions})
    return {"authorization": {"users": entries}}


def _ensure_credentials(path: Path, user: str, namespace: str) -> BusCredentials:
    try:
        existing = load_credentials(path)
    except CredentialsError:
        existing = None
    prefix = inbox_prefix(namespace, user)
    if existing is not None and existing.user == user and existing.inbox_prefix == prefix:
        path.chmod(0o600)
        return existing
    password = existing.password if existing is not None else secrets.token_urlsafe(32)
    credentials = BusCredentials(user, password, prefix)
    _write_private(path, msgspec.json.encode(credentials).decode())
    return credentials


def _remove_other_files(bus_dir: Path, kept: set[Path]) -> None:
    """The server config no longer admits a user left out of the table: its file goes too, so the
    folder shows exactly who may connect."""
    tenants_dir = bus_dir / TENANTS_DIR
    for path in [*bus_dir.glob("*.json"), *tenants_dir.glob("*.json")]:
        if path not in kept:
            path.unlink()
    if tenants_dir.exists() and not any(tenants_dir.iterdir()):
        tenants_dir.rmdir()


def _write_private(path: Path, text: str) -> None:
    """Writes a file only its owner can read, created so from the start, and replaced whole."""
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.write(text + "\n")
    partial.chmod(0o600)
    os.replace(partial, path)
