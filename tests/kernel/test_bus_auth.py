import argparse
import json
import stat

import pytest

from kernel import bus_auth, config_flags
from kernel.actor import Actor, main

ACTOR_USERS = {
    "executor",
    "cache_tier",
    "snapshot",
    "scheduler",
    "tokenizer",
    "gateway",
    "frontdoor",
    "weight_sync",
    "supervisor",
}


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def users(config_path) -> dict[str, dict]:
    return {entry["user"]: entry for entry in json.loads(config_path.read_text())["authorization"]["users"]}


def test_every_actor_and_the_client_get_a_private_credential_file(tmp_path):
    config_path = bus_auth.prepare(tmp_path, "llm")
    bus_dir = tmp_path / "bus"
    assert mode(bus_dir) == 0o700
    assert set(users(config_path)) == ACTOR_USERS | {"client"}
    for user in ACTOR_USERS | {"client"}:
        path = bus_auth.credentials_path(tmp_path, user)
        assert mode(path) == 0o600
        credentials = bus_auth.load_credentials(path)
        assert credentials.user == user
        assert len(credentials.password) >= 32
    assert mode(config_path) == 0o600
    passwords = {bus_auth.load_credentials(bus_auth.credentials_path(tmp_path, u)).password for u in ACTOR_USERS}
    assert len(passwords) == len(ACTOR_USERS)


def test_credentials_already_there_are_reused(tmp_path):
    """So a restarted nats-server admits the actors and clients that are still running."""
    bus_auth.prepare(tmp_path, "llm")
    before = {u: bus_auth.load_credentials(bus_auth.credentials_path(tmp_path, u)) for u in ACTOR_USERS}
    bus_auth.credentials_path(tmp_path, "client").chmod(0o644)
    config_path = bus_auth.prepare(tmp_path, "llm")
    after = {u: bus_auth.load_credentials(bus_auth.credentials_path(tmp_path, u)) for u in ACTOR_USERS}
    assert after == before
    assert users(config_path)["scheduler"]["password"] == before["scheduler"].password
    assert mode(bus_auth.credentials_path(tmp_path, "client")) == 0o600


def test_permissions_follow_the_namespace(tmp_path):
    bus_auth.prepare(tmp_path, "llm")
    password = bus_auth.load_credentials(bus_auth.credentials_path(tmp_path, "scheduler")).password
    scheduler = users(bus_auth.prepare(tmp_path, "team"))["scheduler"]
    assert scheduler["password"] == password
    assert "team.scheduler.requests" in scheduler["permissions"]["subscribe"]["allow"]
    assert not [s for s in scheduler["permissions"]["subscribe"]["allow"] if s.startswith("llm.")]
    credentials = bus_auth.load_credentials(bus_auth.credentials_path(tmp_path, "scheduler"))
    assert credentials.inbox_prefix == "team.inbox.scheduler"


def test_the_client_may_only_request_the_public_subjects_and_read_replies(tmp_path):
    client = users(bus_auth.prepare(tmp_path, "llm"))["client"]["permissions"]
    assert client["publish"] == {"allow": ["llm.generate", "llm.sessions", "llm.admin.>", "$SRV.>"]}
    assert client["subscribe"] == {"allow": ["_INBOX.>"]}
    assert "allow_responses" not in client
    assert bus_auth.load_credentials(bus_auth.credentials_path(tmp_path, "client")).inbox_prefix == "_INBOX"


def test_each_actor_reads_replies_only_at_its_own_inbox(tmp_path):
    entries = users(bus_auth.prepare(tmp_path, "llm"))
    for user in ACTOR_USERS:
        subscribe = entries[user]["permissions"]["subscribe"]["allow"]
        assert f"llm.inbox.{user}.>" in subscribe
        assert not [s for s in subscribe if ".inbox." in s and s != f"llm.inbox.{user}.>"]
        assert "_INBOX.>" not in subscribe


def test_with_keys_each_tenant_gets_a_user_of_its_own_subjects_and_inbox_instead_of_the_client(tmp_path):
    entries = users(bus_auth.prepare(tmp_path, "llm", tenants={"alpha", "beta"}))
    assert set(entries) == ACTOR_USERS | {"tenant.alpha", "tenant.beta"}
    alpha = entries["tenant.alpha"]["permissions"]
    assert alpha["publish"] == {"allow": ["llm.generate.alpha", "llm.sessions.alpha"]}
    assert alpha["subscribe"] == {"allow": ["llm.inbox.tenant.alpha.>"]}
    assert "allow_responses" not in alpha
    path = bus_auth.credentials_path(tmp_path, "tenant.alpha")
    assert path == tmp_path / "bus" / "tenants" / "alpha.json"
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert bus_auth.load_credentials(path).inbox_prefix == "llm.inbox.tenant.alpha"
    # The listeners take the tenant from the subject: none serves the subjects without one.
    gateway, scheduler = (entries[u]["permissions"]["subscribe"]["allow"] for u in ("gateway", "scheduler"))
    assert "llm.generate.*" in gateway and "llm.generate" not in gateway
    assert "llm.sessions.*" in scheduler and "llm.sessions" not in scheduler


def test_an_admin_key_gives_the_admin_subjects_to_an_admin_user_alone(tmp_path):
    entries = users(bus_auth.prepare(tmp_path, "llm", admin=True))
    assert entries["client"]["permissions"]["publish"] == {"allow": ["llm.generate", "llm.sessions"]}
    assert entries["admin"]["permissions"]["publish"] == {"allow": ["llm.admin.>", "$SRV.>"]}
    assert entries["admin"]["permissions"]["subscribe"] == {"allow": ["llm.inbox.admin.>"]}
    keyed = users(bus_auth.prepare(tmp_path, "llm", tenants={"alpha"}, admin=True))
    assert [u for u, e in keyed.items() if "llm.admin.>" in e["permissions"]["publish"].get("allow", [])] == ["admin"]


def test_every_actor_answers_service_discovery_and_every_origin_its_request_figures(tmp_path):
    """Stock NATS tooling asks `$SRV.<verb>`, `$SRV.<verb>.<kind>` and `$SRV.<verb>.<kind>.<id>`."""
    entries = users(bus_auth.prepare(tmp_path, "llm"))
    for actor in ACTOR_USERS - {"supervisor"}:
        permissions = entries[actor]["permissions"]
        assert {"$SRV.*", f"$SRV.*.{actor}", f"$SRV.*.{actor}.*"} <= set(permissions["subscribe"]["allow"])
        assert permissions["allow_responses"] is True
    for origin in ("frontdoor", "gateway"):
        assert "llm.metrics.origins" in entries[origin]["permissions"]["subscribe"]["allow"]
    assert "llm.metrics.origins" in entries["frontdoor"]["permissions"]["publish"]["allow"]


def test_a_user_left_out_of_the_table_loses_its_file(tmp_path):
    """A tenant whose keys went, or the client once keys are on: the folder shows exactly who may connect."""
    bus_auth.prepare(tmp_path, "llm")
    bus_auth.prepare(tmp_path, "llm", tenants={"alpha", "beta"})
    alpha = bus_auth.load_credentials(bus_auth.credentials_path(tmp_path, "tenant.alpha"))
    assert not bus_auth.credentials_path(tmp_path, "client").exists()
    entries = users(bus_auth.prepare(tmp_path, "llm", tenants={"alpha"}))
    assert "tenant.beta" not in entries
    assert sorted(p.name for p in (tmp_path / "bus" / "tenants").iterdir()) == ["alpha.json"]
    assert bus_auth.load_credentials(bus_auth.credentials_path(tmp_path, "tenant.alpha")) == alpha
    bus_auth.prepare(tmp_path, "llm")
    assert not (tmp_path / "bus" / "tenants").exists()
    assert bus_auth.credentials_path(tmp_path, "client").exists()


def test_a_user_with_nothing_to_publish_is_denied_every_publish(tmp_path):
    supervisor = users(bus_auth.prepare(tmp_path, "llm"))["supervisor"]["permissions"]
    assert supervisor["publish"] == {"deny": [">"]}


@pytest.mark.parametrize("content", [None, "not json", '{"user": "client"}', '{"user": "a", "password": "b", "x": 1}'])
def test_a_bad_credential_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / "credentials.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(bus_auth.CredentialsError, match=str(path)):
        bus_auth.load_credentials(path)


def test_the_credentials_flag_round_trips_and_reads_the_environment(monkeypatch):
    parser = argparse.ArgumentParser()
    config_flags.add_arguments(parser)
    cfg = config_flags.from_args(parser.parse_args(["--nats-credentials", "/data/bus/tokenizer.json"]))
    assert cfg.bus.nats_credentials == "/data/bus/tokenizer.json"
    assert config_flags.from_args(parser.parse_args(config_flags.to_argv(cfg))) == cfg
    monkeypatch.setenv("KERNEL_NATS_CREDENTIALS", "/etc/llm/bus.json")
    assert config_flags.from_args(parser.parse_args([])).bus.nats_credentials == "/etc/llm/bus.json"


class Idle(Actor):
    """Does nothing."""

    name = "idle"


def test_an_actor_with_an_unreadable_credential_file_stops_with_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(Idle, ["--nats-url", "nats://127.0.0.1:1", "--nats-credentials", str(tmp_path / "missing.json")])
    assert exit_info.value.code == 2
    assert "--nats-credentials: cannot read" in capsys.readouterr().err
