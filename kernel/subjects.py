"""Every subject name in one place: `<namespace>.<actor>.<verb>`; and the JetStream buckets',
which live in the NATS server beside them, one per namespace too."""

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Subjects:
    namespace: str = "llm"

    def _(self, *parts: str) -> str:
        return ".".join((self.namespace, *parts))

    @property
    def generate(self) -> str:  # public: the bus API for other services
        return self._("generate")

    @property
    def sessions(self) -> str:  # public: OpenSession, CloseSession (the scheduler answers)
        return self._("sessions")

    # With API keys, the public subjects are per tenant, and only the tenant's NATS user may publish
    # on its own (kernel/bus_grants.py): the listener reads the tenant from the subject.
    def tenant_generate(self, tenant: str) -> str:
        return self._("generate", tenant)

    def tenant_sessions(self, tenant: str) -> str:
        return self._("sessions", tenant)

    @property
    def tokenizer(self) -> str:  # Encode, Track (queue group)
        return self._("tokenizer", "requests")

    @property
    def tokenizer_untrack(self) -> str:  # Untrack, to every tokenizer: any of them may track it
        return self._("tokenizer", "untrack")

    @property
    def scheduler(self) -> str:  # Submit, Abort; and from origins, the session conversation (schemas/session.py)
        return self._("scheduler", "requests")

    @property
    def executor_commands(self) -> str:
        return self._("executor", "commands")

    @property
    def executor_describe(self) -> str:
        return self._("executor", "describe")

    @property
    def executor_info(self) -> str:  # broadcast when an executor starts
        return self._("executor", "info")

    @property
    def step_outputs(self) -> str:
        return self._("executor", "steps")

    @property
    def admin_stats(self) -> str:  # public: GetStats -> SchedulerStats
        return self._("admin", "stats")

    @property
    def admin_flush_cache(self) -> str:  # public: FlushCache -> CacheFlushed
        return self._("admin", "flush_cache")

    @property
    def admin_cache(self) -> str:  # public: GetCache -> CacheReport
        return self._("admin", "cache")

    @property
    def admin_publish(self) -> str:  # public: PublishPrefix -> PrefixPublished
        return self._("admin", "publish")

    @property
    def admin_pause(self) -> str:  # public: PauseGeneration -> PauseState
        return self._("admin", "pause")

    @property
    def admin_continue(self) -> str:  # public: ContinueGeneration -> PauseState
        return self._("admin", "continue")

    @property
    def admin_pause_state(self) -> str:  # public: GetPause -> PauseState
        return self._("admin", "pause_state")

    @property
    def admin_weights(self) -> str:  # public: WeightsRequest -> WeightsReply (weight_sync; schemas/admin_weights.py)
        return self._("admin", "weights")

    @property
    def executor_weights(self) -> str:  # ExecutorWeightsRequest -> ExecutorWeightsReply (from weight_sync)
        return self._("executor", "weights")

    @property
    def scheduler_weights(self) -> str:  # WeightsCommitted -> CacheGeneration (from weight_sync)
        return self._("scheduler", "weights")

    @property
    def snapshot_sessions(self) -> str:  # schemas/snapshot.py: the scheduler's saves, drops and restores, in order
        return self._("snapshot", "sessions")

    @property
    def sessions_bucket(self) -> str:  # the snapshot actor's JetStream key-value bucket (kernel/bus_kv.py)
        return self._bucket("sessions")

    @property
    def chains_bucket(self) -> str:  # the cache_tier's JetStream object bucket of KV chains (kernel/bus_objects.py)
        return self._bucket("kv-chains")

    def _bucket(self, purpose: str) -> str:
        """Bucket names allow no dots, which namespaces have: the dots become underscores, and a
        digest of the namespace itself tells `a.b` from `a_b`, so namespaces never share a bucket."""
        digest = hashlib.blake2b(self.namespace.encode(), digest_size=4).hexdigest()
        return f"{purpose}-{self.namespace.replace('.', '_')}-{digest}"

    @property
    def cache_tier(self) -> str:  # schemas/cache.py: the scheduler's spills and fetches of the disk tier
        return self._("cache_tier", "requests")

    @property
    def metrics_origins(self) -> str:  # ReadRequestFigures -> RequestFigures, from every origin (frontdoors, gateways)
        return self._("metrics", "origins")

    def origin(self, origin_id: str) -> str:
        return self._("origin", origin_id)

    def heartbeat(self, actor: str) -> str:
        return self._("heartbeat", actor)

    @property
    def all_heartbeats(self) -> str:
        return self._("heartbeat", "*")
