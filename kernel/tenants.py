"""Tenants, the same at every door (HTTP, the bus): the API keys file that names them, what a
tenant's name may be, and the tenant a request runs as, on which the prefix cache and sessions key.
With keys the server derives the tenant (from the HTTP key, or from the bus subject that only the
tenant's NATS user may publish on); without keys it trusts the network and `user` names the tenant.
"""

import json
import re
from pathlib import Path

from schemas.requests import Tenant

# A tenant's name is a token of its bus subjects and the name of its credential file: so no
# dots, wildcards, slashes or spaces.
TENANT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class KeysFileError(Exception):
    """An API keys file that cannot be read, or is not an object of key -> valid tenant name."""


def read_api_keys(path: str | Path) -> dict[str, str]:
    """The keys file: a JSON object mapping each API key to its tenant's name."""
    try:
        keys = json.loads(Path(path).read_text())
    except OSError as exc:
        raise KeysFileError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise KeysFileError(f"{path} is not JSON: {exc}") from None
    if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, str) and k for k, v in keys.items()):
        raise KeysFileError(f"{path}: expected a JSON object of API key -> tenant name")
    bad = sorted({t for t in keys.values() if not TENANT_NAME.fullmatch(t)})
    if bad:
        raise KeysFileError(
            f"{path}: tenant names are 1 to 64 letters, digits, '_' or '-', not {', '.join(map(repr, bad))}"
        )
    return keys


def request_tenant(key_tenant: str | None, user: str) -> Tenant:
    """The tenant a request runs as: the key's tenant, narrowed by the OpenAI `user` field, which
    stays apart so that publication counts the key's tenant once; without keys (`key_tenant`
    None) `user` alone names the tenant."""
    if key_tenant is None:
        return Tenant(user)
    return Tenant(key_tenant, user)


def may_abort(tenant: Tenant | None, owner: Tenant) -> bool:
    """Whether an abort asked by `tenant` (None: by anyone, a trusted network or an admin) may end
    a request that `owner` runs: one of its own, and with a `user` set, of that user alone."""
    return tenant is None or (owner.name == tenant.name and tenant.user in ("", owner.user))
