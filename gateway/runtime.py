"""The objects one policy is turned into (a `Runtime`), and the long-lived ones every
runtime shares (`Services`).

`create_app()` (gateway/app.py) makes the `Services` once per process: what must outlive
any one policy (the engine HTTP client and its connection pool, the state store, the
metrics registry, telemetry). `build_runtime` makes everything else from a policy and
those services: the fleet, router, breakers, health checks, engine-metrics scraper, DNS
discovery, the pipeline and the Responses service. At start-up that is done once; a
policy reload (gateway/reload.py) builds a second runtime beside the running one, starts
its background tasks, `activate`s it and then stops the old one's.

`activate` swaps the one reference the request path reads (`app.state.runtime`, read
through `current`) in one synchronous step, so no request sees half of each policy: a
request that starts after it uses only new objects, and a request already running keeps
the objects it started with (its replica slot and breaker outcome go back to the objects
it took them from).

What a new runtime takes over from the one it replaces, so that a reload does not make
the gateway forget what it learned about the engines:
- replica objects whose pool and URL are unchanged: health and in-flight counts
  (gateway/fleet/replicas.py), and the last DNS answer of pools whose `discover` is unchanged;
- the breakers, when `resilience.breaker` is unchanged (they are keyed by replica id);
- the router (which replica's prefix cache holds what, session homes, recent load), when
  `routing` is unchanged; a changed `routing` (a weight, the strategy) starts a new one.
- the instance id routing sharing publishes under (gateway/sharing/), so the new runtime's
  followers skip what the old one's publisher wrote.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import aiohttp
from starlette.datastructures import State

from gateway.anthropic.service import MessagesService
from gateway.approvals.audit import AuditLog
from gateway.approvals.decisions import Approvals
from gateway.approvals.gate import ApprovalGate
from gateway.approvals.store import RedisApprovals
from gateway.dashboard.fleet_view import FleetView
from gateway.fleet.discovery import Discovery, DiscoveryMetrics, Resolver
from gateway.fleet.engine_chains import EngineChains
from gateway.fleet.engine_metrics import EngineLoad, EngineMetricsScraper, EngineStats
from gateway.fleet.health import HealthMonitor
from gateway.fleet.kv_events import KvEventSubscriber
from gateway.fleet.replicas import Fleet
from gateway.pipeline import Pipeline
from gateway.policy import Policy
from gateway.prompt.prefix_watch import RedisFingerprints
from gateway.quota.service import Quota, quota_applies
from gateway.quota.store import RedisQuotaStore
from gateway.resilience.breaker import Breakers
from gateway.resilience.dispatcher import Dispatcher
from gateway.resilience.response_cache import RedisResponseCache
from gateway.responses.compaction import Compactions
from gateway.responses.records import RedisResponseRecords
from gateway.responses.service import ResponsesService
from gateway.routing.build import build_router
from gateway.routing.router import CacheAwareRouter, Router, none_elsewhere
from gateway.sessions.store import RedisCheckpoints
from gateway.sessions.turns import SessionTurns
from gateway.sharing.publishing import PublishingRouter
from gateway.sharing.service import RoutingShare, new_instance_id
from gateway.state.store import StateStore
from gateway.state.stored_bytes import StoredBytes
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.prices import Prices
from gateway.telemetry.service import Telemetry
from gateway.tenants.settings import TenantPolicies
from gateway.tiering.chooser import TierChooser, load_learned_router
from gateway.tiering.stickiness import RedisSessionTiers
from gateway.trimming.per_tenant import policy_trimmers
from gateway.upstream.client import Upstream


class CurrentEngineLoads:
    """The engines' load as the current runtime's scraper last read it. Routers read it
    through this, so a router kept across a reload reads the new scraper's numbers."""

    def __init__(self) -> None:
        self.source: EngineMetricsScraper | None = None

    def get(self, url: str) -> EngineLoad | None:
        source = self.source
        return source.get(url) if source is not None else None


@dataclass(frozen=True)
class Services:
    """What lives as long as the process, whatever the policy (the state store open)."""

    upstream: Upstream
    state: StateStore
    metrics: GatewayMetrics
    telemetry: Telemetry
    resolver: Resolver
    discovery_metrics: DiscoveryMetrics
    engine_loads: CurrentEngineLoads
    probes: aiohttp.ClientSession | None  # polls /health and /metrics; None: no polling
    # What the engines' KV events say each conversation still has cached (kept across
    # reloads, like a kept router's index; fed by the runtime's KV-event subscriber).
    engine_chains: EngineChains = field(default_factory=EngineChains)


@dataclass(eq=False)
class Runtime:
    """Everything built from one policy."""

    policy: Policy
    fleet: Fleet
    breakers: Breakers
    router: Router
    discovery: Discovery
    monitor: HealthMonitor | None
    scraper: EngineMetricsScraper | None
    fleet_view: FleetView
    checkpoints: RedisCheckpoints
    pipeline: Pipeline
    responses: ResponsesService
    messages: MessagesService  # the Anthropic Messages API (gateway/anthropic/)
    approvals: Approvals  # the approvals API's (gateway/approvals/)
    tenants: TenantPolicies  # each tenant's settings, merged once (the admin API reads them)
    stored_bytes: StoredBytes  # what each tenant's conversations hold (the admin API shows)
    prices: Prices  # the policy's prices, for telemetry's spend and the quota's budgets
    # Follows the engines' KV-cache events: routing forgets a cache its engine lost.
    kv_events: KvEventSubscriber | None = None
    # Placements and in-flight counts shared with the other gateways (gateway/sharing/);
    # None when sharing is off or the strategy keeps no routing state.
    sharing: RoutingShare | None = None

    async def start(self, *, first: bool) -> None:
        """Start the background tasks, after one round of each that the first requests
        need: the discovered replicas; at start-up who is up (a reload keeps the health of
        the replicas it keeps; one it adds is trusted until checked, like a replica that
        joins through DNS or the engine state file); on a reload the engines' load, which
        a kept router reads from the new scraper as soon as this runtime is active."""
        await self.discovery.refresh_all()
        self.discovery.start()
        if self.kv_events is not None:
            await self.kv_events.start()  # after discovery: the replicas to follow are known
        if self.monitor is not None:
            if first:
                await self.monitor.check_all(first=True)
            self.monitor.start()
        if self.scraper is not None:
            if not first:
                await self.scraper.scrape_all()
            self.scraper.start()
        if self.sharing is not None:
            await self.sharing.start()

    def activate(self, state: State, services: Services, previous: Runtime | None) -> None:
        """Make this the runtime new requests use. Synchronous on purpose: nothing else
        runs on the event loop between the first assignment and the last."""
        services.engine_loads.source = self.scraper
        services.telemetry.prices = self.prices
        registry = services.metrics.registry
        if previous is not None:
            registry.unregister(previous.fleet_view)  # no scrape sees both
            kept = {r.id for r in self.fleet.all_replicas()}
            for replica in previous.fleet.all_replicas():
                if replica.id not in kept:  # a pool or replica the new policy dropped
                    self.router.forget(replica.id)
                    services.engine_chains.forget(replica.id)
        registry.register(self.fleet_view)
        state.runtime = self

    def deactivate(self, services: Services) -> None:
        """At shutdown, after the last request."""
        services.metrics.registry.unregister(self.fleet_view)

    async def stop(self) -> None:
        """Stop the background tasks; requests still running on these objects finish."""
        await self.discovery.stop()
        if self.kv_events is not None:
            await self.kv_events.stop()
        if self.monitor is not None:
            await self.monitor.stop()
        if self.scraper is not None:
            await self.scraper.stop()
        if self.sharing is not None:
            await self.sharing.stop()


def current(state: State) -> Runtime:
    """The runtime new requests use: the app's `state` (`request.app.state`) holds the one
    `activate` made current. Read it once per request, and keep what it gave."""
    runtime: Runtime = state.runtime
    return runtime


def build_runtime(policy: Policy, services: Services, previous: Runtime | None = None) -> Runtime:
    """Build, start nothing: safe to call off the event loop (a reload does, so loading a
    tokenizer or a learned router does not stall requests in flight)."""
    metrics = services.metrics
    prices = Prices(policy)
    fleet = Fleet(policy, previous.fleet if previous is not None else None)
    breakers = (
        previous.breakers
        if previous is not None and previous.policy.resilience.breaker == policy.resilience.breaker
        else Breakers(policy.resilience.breaker, metrics)
    )
    router = (
        previous.router
        if previous is not None and previous.policy.routing == policy.routing
        else build_router(policy.routing, time.monotonic, services.engine_loads)
    )
    chains = services.engine_chains  # replicas that leave are forgotten by the subscriber
    fleet.on_departure(lambda replica: router.forget(replica.id))
    monitor: HealthMonitor | None = None
    scraper: EngineMetricsScraper | None = None
    client = services.upstream
    if services.probes is not None:
        monitor = HealthMonitor(fleet, services.probes, policy.health)
        scraper = EngineMetricsScraper(fleet, services.probes, policy.routing.scrape_interval_s)
    redis = services.state.redis
    assert redis is not None, "the state store opens before any runtime is built"
    fleet_view = FleetView(
        fleet,
        breakers,
        scraper.stats if scraper else _no_stats,
        services.telemetry.live.replica_requests,
    )
    sharing = _routing_share(policy, services, fleet, router, previous)
    # Requests the other gateways have in flight: admitted against and priced as queued.
    peer_inflight = sharing.peer_inflight if sharing is not None else none_elsewhere
    if isinstance(router, CacheAwareRouter):
        router.peer_inflight = peer_inflight
        router.engine_held = chains.held_at  # {} while no replica's events are followed
    tenants = TenantPolicies(policy)  # each tenant's settings, merged once
    stored = StoredBytes(
        redis,
        ttl_s=policy.sessions.ttl_s,
        cap_of=lambda tenant: tenants.of(tenant).limits.stored_bytes,
        on_count=lambda tenant, held: metrics.stored_bytes.labels(tenant).set(held),
    )
    checkpoints = RedisCheckpoints(redis, ttl_s=policy.sessions.ttl_s, stored=stored)
    trimmer, tenant_trimmers = policy_trimmers(policy.trimming, tenants)
    approvals = Approvals(
        RedisApprovals(redis, keep_s=policy.approvals.keep_s, stored=stored),
        AuditLog(redis, metrics, max_entries=policy.approvals.audit_max_entries),
    )
    pipeline = Pipeline(
        policy,
        fleet,
        router,
        client,
        fingerprints=RedisFingerprints(redis),
        metrics=metrics,
        sessions=SessionTurns(checkpoints, trimmer, tenant_trimmers, stored=stored),
        tiers=TierChooser(
            policy,
            fleet,
            memory=RedisSessionTiers(redis),
            cached_share=router.cached_share,
            load_scorer=load_learned_router,
        ),
        dispatcher=Dispatcher(
            policy,
            PublishingRouter(router, sharing) if sharing is not None else router,
            client,
            metrics,
            engine_load=scraper.get if scraper else None,
            breakers=breakers,
            peer_inflight=peer_inflight,
            peer_tenants=sharing.peer_tenants if sharing is not None else None,
        ),
        response_cache=RedisResponseCache(
            redis, ttl_s=policy.resilience.response_cache.ttl_s, stored=stored
        ),
        tenants=tenants,
        approvals=(
            ApprovalGate(policy.approvals, approvals)
            if policy.approvals.enabled or policy.tool_calls.holds
            else None
        ),
        quota=(
            Quota(
                policy,
                RedisQuotaStore(redis),
                metrics,
                prices=prices,
                context_of=fleet.context_tokens,
            )
            if quota_applies(policy)
            else None
        ),
    )
    compactions = Compactions(redis, ttl_s=policy.sessions.ttl_s, stored=stored)
    return Runtime(
        policy=policy,
        fleet=fleet,
        breakers=breakers,
        router=router,
        discovery=Discovery(fleet, services.resolver, services.discovery_metrics),
        monitor=monitor,
        scraper=scraper,
        fleet_view=fleet_view,
        checkpoints=checkpoints,
        pipeline=pipeline,
        responses=ResponsesService(
            pipeline,
            checkpoints,
            RedisResponseRecords(redis, ttl_s=policy.sessions.ttl_s, stored=stored),
            compactions=compactions,
            tenants=tenants,
            stored=stored,
            metrics=metrics,
        ),
        messages=MessagesService(
            pipeline, tenants=tenants, compactions=compactions, metrics=metrics
        ),
        approvals=approvals,
        tenants=tenants,
        stored_bytes=stored,
        prices=prices,
        kv_events=KvEventSubscriber(fleet.all_replicas, router.forget, metrics, chains),
        sharing=sharing,
    )


def _routing_share(
    policy: Policy, services: Services, fleet: Fleet, router: Router, previous: Runtime | None
) -> RoutingShare | None:
    """Sharing is on when asked, or by default when the state store is a Redis other
    gateways can reach (`state.redis_url`). A reload keeps the process's instance id, so
    the new runtime skips what the old one published."""
    spec = policy.routing.sharing
    enabled = spec.enabled if spec.enabled is not None else bool(policy.state.redis_url)
    redis = services.state.redis
    if not enabled or redis is None or not isinstance(router, CacheAwareRouter):
        return None
    kept = previous.sharing.instance if previous is not None and previous.sharing else None
    return RoutingShare(
        redis, spec, fleet, router, services.metrics, instance=kept or new_instance_id()
    )


def _no_stats(url: str) -> EngineStats | None:
    return None
