from actors.frontdoor.tenants import Identity, Tenants
from schemas.errors import Error
from schemas.requests import Tenant


def test_without_keys_user_names_the_tenant():
    tenants = Tenants()
    identity = tenants.identify("/v1/completions", None)
    assert identity == Identity(None, False)
    assert tenants.request_tenant(identity, "bob") == Tenant("bob")
    assert tenants.identify("/admin/stats", None).admin


def test_with_keys_the_key_decides_and_user_only_narrows():
    tenants = Tenants({"k1": "acme"}, admin_key="adm")
    identity = tenants.identify("/v1/completions", "Bearer k1")
    assert identity.tenant == "acme"
    assert tenants.request_tenant(identity, "") == Tenant("acme")
    assert tenants.request_tenant(identity, "other-tenant") == Tenant("acme", "other-tenant")
    for header in (None, "Bearer nope", "k1", "Basic k1"):
        assert isinstance(tenants.identify("/v1/completions", header), Error)
    assert isinstance(tenants.identify("/admin/stats", "Bearer k1"), Error)
    assert tenants.identify("/admin/stats", "Bearer adm").admin
    for path in ("/pause_generation", "/continue_generation", "/pause", "/resume", "/is_paused"):
        assert isinstance(tenants.identify(path, "Bearer k1"), Error)
        assert tenants.identify(path, "Bearer adm").admin
    assert tenants.identify("/health", None) == Identity(None, False)
