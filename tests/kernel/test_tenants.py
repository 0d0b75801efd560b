"""The keys file and the tenant a request runs as, which HTTP and the bus share (kernel/tenants.py)."""

import json
import subprocess
import sys

import pytest

from kernel.tenants import KeysFileError, read_api_keys, request_tenant
from schemas.requests import Tenant


def test_a_keys_file_maps_keys_to_tenants(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"key-1": "acme", "key-2": "acme", "key-3": "beta_co-2"}))
    assert read_api_keys(path) == {"key-1": "acme", "key-2": "acme", "key-3": "beta_co-2"}


@pytest.mark.parametrize("tenant", ["a.b", "a/b", "a*", ">", "two words", "", "x" * 65])
def test_a_tenant_name_that_cannot_name_a_subject_is_refused(tmp_path, tenant):
    """A dot or wildcard would reach other tenants' subjects, a space would split a subject, and a
    slash would take the tenant's credential file out of its folder."""
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"key": tenant}))
    with pytest.raises(KeysFileError, match="tenant names are"):
        read_api_keys(path)


@pytest.mark.parametrize("content", [None, "not json", "[]", '{"": "acme"}', '{"key": 1}'])
def test_a_bad_keys_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / "keys.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(KeysFileError, match=str(path)):
        read_api_keys(path)


def test_the_supervisor_refuses_a_bad_keys_file_before_starting_anything(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"key": "a.b"}))
    done = subprocess.run(
        [sys.executable, "-m", "kernel.supervisor", "--data-dir", str(tmp_path / "data"), "--api-keys", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--api-keys:" in done.stderr and "'a.b'" in done.stderr
    assert not (tmp_path / "data").exists()


def test_user_names_the_tenant_without_keys_and_narrows_within_it_with_them():
    assert request_tenant(None, "bob") == Tenant("bob")
    assert request_tenant("acme", "") == Tenant("acme")
    assert request_tenant("acme", "bob") == Tenant("acme", "bob")  # the user apart: publication counts acme once
