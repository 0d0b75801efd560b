"""Who is asking, over HTTP. With API keys configured, the tenant comes from the key and a client
never chooses it; the OpenAI `user` field only narrows within that tenant. With no keys, the
server trusts the network and `user` names the tenant. The tenant scopes the prefix cache; the
rule is kernel/tenants.py's, which the bus follows too."""

import hmac
from dataclasses import dataclass

from kernel import tenants
from schemas.errors import Error
from schemas.requests import Tenant

# `/metrics` carries no tenant's data (no figure is by tenant), and Prometheus scrapes it as vLLM's.
PUBLIC_PATHS = frozenset({"/health", "/health/ready", "/health_generate", "/openapi.json", "/metrics"})
# Admin routes outside /admin/, under the names SGLang's and vLLM's clients call: pausing, live
# weights, sleep and wake, cache flushes. `/get_weight_version` is not among them: every reply
# carries the version anyway.
ADMIN_PATHS = frozenset(
    {
        "/pause_generation",
        "/continue_generation",
        "/pause",
        "/resume",
        "/is_paused",
        "/update_weights_from_disk",
        "/update_weights_from_distributed",
        "/update_weights_from_tensor",
        "/init_weights_update_group",
        "/destroy_weights_update_group",
        "/update_weight_version",
        "/get_weights_by_name",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/sleep",
        "/wake_up",
        "/is_sleeping",
        "/flush_cache",
        "/reset_prefix_cache",
    }
)


@dataclass(frozen=True)
class Identity:
    tenant: str | None  # None when no API keys are configured
    admin: bool


class Tenants:
    def __init__(self, keys: dict[str, str] | None = None, admin_key: str | None = None) -> None:
        self.keys = keys
        self.admin_key = admin_key

    @classmethod
    def from_config(cls, api_keys_file: str | None, admin_key: str | None) -> "Tenants":
        """Reads the keys file (`kernel.tenants.read_api_keys`), which the supervisor checked before starting us."""
        if api_keys_file is None:
            return cls(None, admin_key)
        return cls(tenants.read_api_keys(api_keys_file), admin_key)

    def identify(self, path: str, authorization: str | None) -> Identity | Error:
        """The caller's identity, or a 401 when the route needs a key it did not give."""
        key = (
            authorization.removeprefix("Bearer ").strip()
            if authorization and authorization.startswith("Bearer ")
            else None
        )
        admin = bool(self.admin_key and key and hmac.compare_digest(key, self.admin_key))
        if path in PUBLIC_PATHS:
            return Identity(None, admin)
        if path.startswith("/admin/") or path in ADMIN_PATHS:
            if self.admin_key is None and self.keys is None:
                return Identity(None, True)  # no keys at all: the network is trusted
            return Identity(None, True) if admin else Error("unauthorized", "admin routes need the admin key")
        if self.keys is None:
            return Identity(None, admin)
        tenant = next((t for k, t in self.keys.items() if key and hmac.compare_digest(k, key)), None)
        if tenant is None:
            return Error("unauthorized", "a valid API key is required: Authorization: Bearer <key>")
        return Identity(tenant, admin)

    def needs_key(self, path: str) -> bool:
        """Whether `identify` answers 401 to a request on `path` that gives no key."""
        if path in PUBLIC_PATHS:
            return False
        if path.startswith("/admin/") or path in ADMIN_PATHS:
            return self.admin_key is not None or self.keys is not None
        return self.keys is not None

    def request_tenant(self, identity: Identity, user: str) -> Tenant:
        return tenants.request_tenant(identity.tenant, user)
