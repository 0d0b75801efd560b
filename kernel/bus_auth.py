"""Who may say what on the bus: one NATS user per actor, allowed only the subjects of that actor,
and a `client` user for other services. The supervisor writes every user's credential file and
the embedded nats-server's config into `<data_dir>/bus/`; a process needs only its credential file.
"""

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import msgspec

from kernel.subjects import Subjects

BUS_DIR = "bus"
SERVER_CONFIG = "nats-server.conf"
CLIENT_INBOXES = "_INBOX.>"  # where nats-py clients receive replies, unless they choose another prefix


class BusCredentials(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A credential file, as JSON: `{"user": ..., "password": ...}`."""

    user: str
    password: str
    # Where this user's reply inboxes live; each actor has its own, so no user can read another's
    # replies. None: nats-py's default, `_INBOX`.
    inbox_prefix: str | None = None


class CredentialsError(Exception):
    """A credential file that cannot be read or is not a user and password."""


@dataclass(frozen=True)
class Grant:
    publish: list[str]
    subscribe: list[str]
    answers_requests: bool = False  # may send one reply to each request it receives (`allow_responses`)


def grants(s: Subjects) -> dict[str, Grant]:
    """What each user may publish and subscribe to: the one table to extend with a new actor.
    Every user may also subscribe to its own inbox (see `inbox_prefix`)."""
    return {
        "executor": Grant(
            publish=[s.step_outputs, s.executor_info, s.heartbeat("executor")],
            subscribe=[s.executor_commands, s.executor_describe],
            answers_requests=True,
        ),
        "scheduler": Grant(
            publish=[s.executor_commands, s.executor_describe, s.heartbeat("scheduler")],
            subscribe=[s.scheduler, s.sessions, s.executor_info, s.step_outputs, s.admin_stats, s.admin_flush_cache, s.admin_cache, s.admin_publish,
                       s.heartbeat("frontdoor"), s.heartbeat("gateway")],
            answers_requests=True,
        ),
        "tokenizer": Grant(
            publish=[s.scheduler, s.origin("*"), s.heartbeat("tokenizer")],
            subscribe=[s.tokenizer, s.tokenizer_untrack, s.step_outputs],
            answers_requests=True,
        ),
        "gateway": Grant(
            # A stream is many replies, sent again to a new inbox on resume and after a bus outage
            # (which forgets one-reply grants): the gateway may publish to every client inbox.
            publish=[s.tokenizer, s.tokenizer_untrack, s.scheduler, s.heartbeat("gateway"), CLIENT_INBOXES],
            subscribe=[s.generate, s.origin("*"), s.all_heartbeats, s.step_outputs],  # steps: requests without text
            answers_requests=True,
        ),
        "frontdoor": Grant(
            publish=[s.tokenizer, s.tokenizer_untrack, s.scheduler, s.admin_stats, s.admin_flush_cache, s.admin_cache, s.admin_publish,
                     s.heartbeat("frontdoor")],
            subscribe=[s.origin("*"), s.all_heartbeats, s.step_outputs],  # steps: requests without text
        ),
        "supervisor": Grant(publish=[], subscribe=[s.all_heartbeats]),
        "client": Grant(publish=[s.generate, s.sessions, f"{s.namespace}.admin.>"], subscribe=[CLIENT_INBOXES]),
    }


def inbox_prefix(namespace: str, user: str) -> str | None:
    """Actors receive replies under `<ns>.inbox.<user>`, out of clients' reach; clients keep nats-py's default."""
    return None if user == "client" else f"{namespace}.inbox.{user}"


def credentials_path(data_dir: Path, user: str) -> Path:
    return Path(data_dir) / BUS_DIR / f"{user}.json"


def load_credentials(path: str | Path) -> BusCredentials:
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=BusCredentials)
    except OSError as exc:
        raise CredentialsError(f"cannot read {path}: {exc.strerror}") from None
    except msgspec.DecodeError as exc:
        raise CredentialsError(f'{path} is not a credential file ({{"user": ..., "password": ...}}): {exc}') from None


def prepare(data_dir: Path, namespace: str, max_payload: int | None = None) -> Path:
    """Makes sure every user has credentials in `<data_dir>/bus/` (reusing those already there, so
    running actors and clients keep working across restarts) and writes the server config from
    the table above, with the largest message the server takes (its own default if None); returns
    the config's path."""
    bus_dir = Path(data_dir) / BUS_DIR
    bus_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    bus_dir.chmod(0o700)
    table = grants(Subjects(namespace))
    users = {user: _ensure_credentials(bus_dir / f"{user}.json", user, namespace) for user in table}
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
        inbox = credentials.inbox_prefix or CLIENT_INBOXES.removesuffix(".>")
        subscribe = list(dict.fromkeys([*grant.subscribe, f"{inbox}.>"]))
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


def _write_private(path: Path, text: str) -> None:
    """Writes a file only its owner can read, created so from the start, and replaced whole."""
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.write(text + "\n")
    partial.chmod(0o600)
    os.replace(partial, path)
