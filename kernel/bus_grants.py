"""Who may say what on the bus: one NATS user per actor, allowed only the subjects of that actor,
and users for other services: without API keys one `client` user, which the network is trusted
with as over HTTP; with keys one user per tenant, on its own subjects and inboxes alone. An admin
key adds an `admin` user, then the only service user that may call the admin subjects. The users'
credentials and the server's config are kernel/bus_auth.py's.
"""

from collections.abc import Collection
from dataclasses import dataclass

from kernel.subjects import Subjects

CLIENT_INBOX = "_INBOX"  # nats-py's default inbox prefix, the `client` user's
TENANT = "tenant"  # tenant users are `tenant.<name>`, so no tenant name can be an actor's
ADMIN = "admin"
# NATS micro services' PING, INFO and STATS, which every actor answers (kernel/bus_service.py)
SERVICE_DISCOVERY = "$SRV.>"


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


def object_bucket(bucket: str) -> list[str]:
    """What a user publishes to use one JetStream object bucket, and no other stream: bind or make
    it, put objects (chunks and meta messages, each acknowledged to the user's inbox), read them
    (a pull consumer), list them from the stream's books, delete or purge them."""
    stream = f"OBJ_{bucket}"
    return [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.STREAM.PURGE.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.FC.{stream}.>",
        f"$O.{bucket}.>",
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
    # The admin routes' requests: the frontdoor asks, the scheduler answers (admin_weights, for the
    # weight routes and the version in the info routes: weight_sync too).
    admin_requests = [
        s.admin_stats,
        s.admin_flush_cache,
        s.admin_cache,
        s.admin_publish,
        s.admin_pause,
        s.admin_continue,
        s.admin_pause_state,
        s.admin_weights,
    ]
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
                *admin_requests,
                s.heartbeat("frontdoor"),
                s.heartbeat("gateway"),
                s.heartbeat("snapshot"),  # a restarted snapshot actor gets every session again
                s.heartbeat("cache_tier"),  # a restarted cache_tier moves none of the slots the last one had
                *discovery("scheduler"),
            ],
            answers_requests=True,
        ),
        "cache_tier": Grant(
            publish=[s.heartbeat("cache_tier"), *object_bucket(s.chains_bucket)],
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
                *admin_requests,
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
