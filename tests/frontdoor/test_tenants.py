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


def test_live_weight_memory_and_flush_routes_need_the_admin_key():
    tenants = Tenants({"k1": "acme"}, admin_key="adm")
    for path in (
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
    ):
        assert isinstance(tenants.identify(path, "Bearer k1"), Error), path
        assert tenants.identify(path, "Bearer adm").admin
        assert Tenants().identify(path, None).admin  # no keys at all: the network is trusted
    # The version is in every reply anyway: a tenant may ask for it.
    assert tenants.identify("/get_weight_version", "Bearer k1") == Identity("acme", False)
