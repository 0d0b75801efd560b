"""The bus's users and their passwords: the supervisor writes every user's credential file and the
embedded nats-server's config, with each user's grants (kernel/bus_grants.py), into
`<data_dir>/bus/`; a process needs only its credential file.
"""

import json
import os
import secrets
from collections.abc import Collection
from pathlib import Path

import msgspec

from kernel.bus_grants import TENANT, Grant, grants, inbox_prefix
from kernel.subjects import Subjects

BUS_DIR = "bus"
TENANTS_DIR = "tenants"  # a credential file per tenant, named after it: the file to hand to each
SERVER_CONFIG = "nats-server.conf"


class BusCredentials(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A credential file, as JSON: `{"user": ..., "password": ...}`."""

    user: str
    password: str
    # Where this user's reply inboxes live (nats-py's `inbox_prefix`): each user has its own, which
    # no other user may read. None (in files for an external server): nats-py's default, `_INBOX`.
    inbox_prefix: str | None = None


class CredentialsError(Exception):
    """A credential file that cannot be read or is not a user and password."""


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
