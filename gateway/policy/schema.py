"""The policy's strict schema: unknown keys, wrong types and bad values are rejected.

These are raw, frozen configuration records. gateway/fleet/replicas.py builds the runtime
objects (pools with live replica state) from them at start-up and on every policy
reload (gateway/reload.py).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from gateway.policy.approvals import ApprovalsSpec
from gateway.policy.base import Name, Strict
from gateway.policy.canonicalize import CanonicalizeSpec
from gateway.policy.quota import BudgetSpec, QuotaSpec, RateLimitSpec
from gateway.policy.resilience import ResilienceSpec
from gateway.policy.sessions import SessionsSpec, StateSpec, TrimmingSpec
from gateway.policy.telemetry import PriceSpec, TelemetrySpec
from gateway.policy.tenant_overrides import LimitsOverride, TrimmingOverride
from gateway.policy.tiering import TieringSpec
from gateway.policy.tool_calls import ToolCallsSpec
from gateway.untrusted.client_text import control_character


class Endpoint(StrEnum):
    """The OpenAI endpoints a pool's engines serve."""

    chat = "chat"
    completions = "completions"
    embeddings = "embeddings"


def _http_base_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http(s) base URL such as http://127.0.0.1:8001")
    if parts.query or parts.fragment:
        raise ValueError("a replica URL takes no query or fragment")
    return value.rstrip("/")


BaseUrl = Annotated[str, AfterValidator(_http_base_url)]


class ServerSpec(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    reload_interval_s: float = Field(
        5.0,
        ge=0,
        description="How often `gateway serve` re-reads the policy file and applies it when "
        "its content changed (gateway/reload.py); 0: only on SIGHUP.",
    )
    # The client side of the gateway's sockets (gateway/edge/connections.py); restart-only.
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A client's request headers must be complete within this long of its "
        "connecting (or of the first byte of a later request on the connection); else the "
        "connection is closed, with 408 request_timeout if a request had begun. Bounds "
        "slowloris clients and connections that never send a byte.",
    )
    keep_alive_s: float = Field(
        5.0,
        gt=0,
        description="A kept-alive connection idle this long after a response is closed "
        "(uvicorn's timeout_keep_alive). Behind a load balancer that reuses connections, set "
        "it above the balancer's idle timeout.",
    )
    max_connections: int = Field(
        8192,
        ge=1,
        description="Most client connections open at once. A new one past it closes the "
        "connection idle the longest (no byte sent yet, or waiting between requests); when "
        "none is idle, the new one is closed at once. A request in flight is never cut.",
    )


class LimitsSpec(Strict):
    """Input hardening: ceilings set far above what a working agent sends, so that a
    runaway or hostile client gets a 400 naming the field instead of costing memory,
    recursion or an engine's time (checked once while parsing: gateway/chat/inbound.py)."""

    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0, description="Larger request bodies get 413.")
    max_messages: int = Field(
        2048,
        ge=1,
        description="Most `messages` in a chat request (input items of a Responses request); "
        "more get 400 array_above_max_length.",
    )
    max_tools: int = Field(
        256,
        ge=1,
        description="Most `tools` in one request; more get 400 array_above_max_length.",
    )
    # At most 128: the gateway re-serialises bodies with orjson, which stops at 255 levels.
    max_json_depth: int = Field(
        64,
        ge=8,
        le=128,
        description="Deepest nesting of arrays and objects in a request body (the body "
        "itself is level 1; a tool's parameter schema starts at level 5); deeper gets 400 "
        "json_too_deep.",
    )
    max_tokens: int = Field(
        131_072,
        ge=1,
        description="Highest `max_tokens` / `max_completion_tokens` (`max_output_tokens` "
        "in the Responses API) a request may ask for; higher gets 400 max_tokens_too_large. "
        "The engine still enforces its own context length below this.",
    )
    hosted_tools: Literal["drop", "refuse"] = Field(
        "drop",
        description="Tools the engine cannot run (the Responses API's hosted `web_search`, "
        "`file_search`, `code_interpreter`, ...; Anthropic's server tools): left out of what "
        "the engine sees and named in X-Gateway-Tools-Dropped, or refused with 400.",
    )
    max_n: int = Field(
        16,
        ge=1,
        description="Highest `n` (choices per request, chat and completions) a request may "
        "ask for; higher gets 400 integer_above_max_value. `n` multiplies the engine's work "
        "and the request's token estimate against rate limits and budgets.",
    )


class TimeoutsSpec(Strict):
    connect_s: float = Field(3.0, gt=0, description="Opening a connection to an engine.")
    first_byte_s: float = Field(
        120.0, gt=0, description="From sending the request to the engine's response headers."
    )
    idle_s: float = Field(
        60.0, gt=0, description="Longest silence between two chunks of a streamed answer."
    )
    total_s: float = Field(600.0, gt=0, description="Whole request, streaming included.")


class HealthSpec(Strict):
    interval_s: float = Field(2.0, gt=0, description="How often each replica's /health is polled.")
    timeout_s: float = Field(1.0, gt=0)
    failures_to_unhealthy: int = Field(
        2, ge=1, description="Consecutive failed polls before a replica leaves the rotation."
    )
    retry_after_s: int = Field(
        2, ge=1, description="Retry-After sent with 503 when no replica of a model is healthy."
    )


class RoutingWeights(Strict):
    """Exchange rates between costs, in prefill blocks (see gateway/routing/costs.py)."""

    prefix: float = Field(1.0, ge=0, description="Per block the replica would have to prefill.")
    load: float = Field(
        1.0,
        ge=0,
        description="Per block of recent work, with this request's prefill added, above the "
        "tolerated mean.",
    )
    queue: float = Field(
        0.25,
        ge=0,
        description="Per request in flight (from every gateway process, as last shared) "
        "or waiting at the replica.",
    )
    session: float = Field(8.0, ge=0, description="For leaving the replica the session uses.")


class SharingSpec(Strict):
    """Routing state shared between gateway processes through the state store's Redis
    (gateway/sharing/): each gateway publishes where it sent what, and learns the others'
    placements and in-flight counts; reads stay in process. Restart-only."""

    enabled: bool | None = Field(
        None,
        description="Share placements and in-flight counts with the other gateways. Unset: on "
        "when `state.redis_url` is set (a shared Redis is how several gateways meet; the "
        "embedded Redis is private to one process, so there is no one to share with).",
    )
    flush_ms: int = Field(
        10,
        ge=1,
        le=1000,
        description="How often queued placements and in-flight counts are written to Redis: "
        "the bound on how stale the other gateways' view is, less one Redis round trip.",
    )
    stream_max_entries: int = Field(
        10_000,
        ge=100,
        description="A pool's placement stream is trimmed to about this many batches "
        "(XADD MAXLEN ~): what a gateway can catch up on after a Redis outage.",
    )
    inflight_ttl_s: float = Field(
        2.0,
        gt=0,
        description="Another gateway's published in-flight counts stop counting toward "
        "`max_inflight_per_replica` when it has not renewed them for this long (it stopped "
        "or lost Redis).",
    )
    max_queued: int = Field(
        10_000,
        ge=1,
        description="Placements held while Redis does not answer; older ones are dropped.",
    )


class RoutingSpec(Strict):
    strategy: Literal["cache_aware", "round_robin"] = "cache_aware"
    block_bytes: int = Field(
        512,
        ge=64,
        multiple_of=8,
        description="Prompt bytes per prefix block (about 128 tokens); a multiple of 8.",
    )
    implicit_sessions: bool = Field(
        True,
        description="Without X-Session-Id, a chat request's first block and first message "
        "after the system prompt identify its conversation for session affinity.",
    )
    index_blocks_per_replica: int = Field(
        10_000, ge=1, description="Blocks remembered per replica: size it like the engine's cache."
    )
    load_half_life_s: float = Field(15.0, gt=0, description="Decay of the recent-work signal.")
    weights: RoutingWeights = RoutingWeights()
    max_load_factor: float = Field(
        2.0, ge=1, description="Replicas above this multiple of the mean recent work are skipped."
    )
    load_slack_blocks: float = Field(256.0, ge=0, description="Added to that bound.")
    load_tolerance: float = Field(
        0.25, ge=0, description="Recent work up to this fraction above the mean costs nothing."
    )
    shared_opening_conversations: int = Field(
        2,
        ge=0,
        description="Once this many conversations began with the same prefix blocks (a common "
        "system prompt and tools), they count as held by every replica when a new conversation "
        "is placed, so session affinity and load place it, not the first replica that held "
        "them; 0: off.",
    )
    max_waiting: int = Field(32, ge=1, description="A replica with this many queued is saturated.")
    max_kv_usage: float = Field(
        0.98, gt=0, le=1, description="KV usage at which a replica is saturated."
    )
    scrape_interval_s: float = Field(1.0, gt=0, description="How often engines' /metrics are read.")
    sharing: SharingSpec = Field(
        SharingSpec(),
        description="Placements and in-flight counts shared with the other gateway processes.",
    )


class ReplicaSpec(Strict):
    url: BaseUrl


class DnsDiscoverySpec(Strict):
    """Replicas found in DNS: a Kubernetes headless Service answers one A/AAAA record per
    ready pod, and each address joins the pool as its own replica (gateway/fleet/discovery.py)."""

    dns: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,253}$")] = Field(
        description="Name to resolve, e.g. vllm-large.agent-gateway.svc.cluster.local."
    )
    port: int = Field(8000, ge=1, le=65535, description="The engines' HTTP port.")
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(5.0, gt=0, description="How often the name is resolved again.")
    timeout_s: float = Field(2.0, gt=0, description="A resolution taking longer has failed.")
    family: Literal["auto", "ipv4", "ipv6"] = Field(
        "auto",
        description="Addresses used: auto takes the IPv4 ones when there are any, else the "
        "IPv6 ones, so a dual-stack pod (A and AAAA) is one replica, not two.",
    )
    empty_after_rounds: int = Field(
        3,
        ge=1,
        description="Consecutive answers of no such name / no address before the pool's "
        "discovered replicas are dropped; a failed lookup (timeout, server error) never "
        "drops them.",
    )


class PoolSpec(Strict):
    """Engine replicas that serve the same model; the unit the gateway routes within."""

    tier: Name = Field("default", description="Tier label, e.g. small or large.")
    served_model: Name = Field(
        description="The model name the engines serve (vLLM --served-model-name)."
    )
    serves: tuple[Endpoint, ...] = Field((Endpoint.chat, Endpoint.completions), min_length=1)
    replicas: tuple[ReplicaSpec, ...] = ()
    engine_state: str | None = Field(
        None,
        description=(
            "Path of the state file `engine up` writes; its replicas labelled with this "
            "pool's name join the pool, and the file is re-read when it changes."
        ),
    )
    discover: DnsDiscoverySpec | None = Field(
        None,
        description="Find replicas by resolving a DNS name (a headless Service): the "
        "addresses found join the pool, and leave it when they leave the answer.",
    )
    structured_outputs: bool = Field(
        True, description="The engines constrain output to a schema, choice or regex (vLLM)."
    )
    kv_events: bool = Field(
        False,
        description="Follow the KV-cache events of the replicas listed in `replicas:` and "
        "found through `discover:` at their HTTP port - 1000 (replay socket: - 2000), the "
        "ports engine profiles and manifests give them. Replicas from `engine_state:` are "
        "followed wherever the state file says they publish, whatever this says.",
    )
    price: PriceSpec | None = Field(
        None, description="What this pool's model costs per million tokens (token economics)."
    )


# A tenant's name is a Redis key part and a metric label: no `/`, `:` or braces.
TenantName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)]
# A key is kept only as the lowercase hex SHA-256 of its text (`printf %s KEY | sha256sum`).
KeyDigest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
KeyRole = Literal["user", "approver"]


def _one_line(value: str) -> str:
    if (bad := control_character(value)) is not None:
        raise ValueError(f"must not contain control characters (found {bad})")
    return value


# A key's name is listed and written into log lines: no line breaks or other control
# characters (a run-time key's name is held to the same rule: gateway/untrusted/client_text.py).
KeyName = Annotated[str, Field(max_length=128), AfterValidator(_one_line)]


class StaticKeySpec(Strict):
    """A tenant's key written into the policy, hashed (never the key itself)."""

    sha256: KeyDigest = Field(description="Lowercase hex SHA-256 of the key's text.")
    name: KeyName = Field("", description="A label for people (who holds it).")
    roles: tuple[KeyRole, ...] = Field(
        ("user",), description="`user` calls /v1; `approver` may also decide approvals."
    )
    rate_limits: RateLimitSpec | None = Field(
        None, description="This key's own limits, in place of its tenant's key_rate_limits."
    )


class AdminKeySpec(Strict):
    sha256: KeyDigest = Field(description="Lowercase hex SHA-256 of the admin key's text.")
    name: KeyName = ""


class TenantSpec(Strict):
    """One tenant: its keys and what it may do (gateway/tenants/)."""

    keys: tuple[StaticKeySpec, ...] = Field((), description="Static keys, hashed.")
    models: tuple[Name, ...] | None = Field(
        None,
        description="The model aliases this tenant may use (and sees in /v1/models); any "
        "other is 404 model_not_found, as for a model that does not exist. Unset: all.",
    )
    capture_content: bool = Field(
        False,
        description="Prompts and answers of this tenant's requests go on sampled spans, and "
        "the router's text in the request log (with `telemetry.traces.capture_content` "
        "on); off: never captured.",
    )
    # -- per-tenant settings over the top-level sections (gateway/policy/tenant_overrides.py)
    tiers: tuple[Name, ...] | None = Field(
        None,
        description="The tiers this tenant may be served on: a fixed model's pool tier must "
        "be one; a routable model's chosen tier moves to the most capable allowed tier "
        "below it, else the cheapest above. Unset: all.",
    )
    limits: LimitsOverride | None = Field(
        None, description="Fields of `limits` for this tenant (lower or higher)."
    )
    trimming: TrimmingOverride | None = Field(
        None, description="`enabled` and the watermarks of `trimming` for this tenant."
    )
    fallbacks: dict[Name, tuple[Name, ...]] = Field(
        default_factory=dict,
        description="Model alias -> its fallbacks for this tenant, replacing the model's "
        "own (`[]`: none). A model's own fallbacks this tenant may not use are skipped.",
    )
    # -- end of per-tenant settings
    rate_limits: RateLimitSpec | None = Field(
        None, description="Limits of the whole tenant, all its keys together (gateway/quota/)."
    )
    key_rate_limits: RateLimitSpec | None = Field(
        None, description="Limits of each key of the tenant, unless the key has its own."
    )
    budget: BudgetSpec | None = Field(
        None, description="Tokens or dollars per UTC day and month (gateway/quota/)."
    )
    share: float = Field(
        1.0,
        gt=0,
        le=1000,
        description="This tenant's weight when a pool's replicas are full: each tenant with "
        "requests in flight or waiting is entitled to capacity in proportion to its weight; "
        "one below that waits in line first, one above it is shed first. Tenants not listed "
        "weigh 1 (gateway/resilience/fair_share.py).",
    )
    prefix_cache: Literal["isolated", "shared"] | None = Field(
        None,
        description="Whether this tenant's prompts share the engines' prefix cache with other "
        "tenants (`shared`) or only with its own requests (`isolated`: a `cache_salt` of its "
        "own at the engine, its own keyspace in the router's index). Unset: isolated when the "
        "policy lists a tenant other than `default`, shared otherwise "
        "(gateway/tenants/cache_scope.py).",
    )
    prefix_cache_group: Name | None = Field(
        None,
        description="With `prefix_cache: shared`: share only with the tenants of this group "
        "(one company's agents sharing a system prompt). Unset: share with every tenant "
        "that shares without a group.",
    )

    @model_validator(mode="after")
    def _group_only_when_shared(self) -> TenantSpec:
        if self.prefix_cache_group is not None and self.prefix_cache == "isolated":
            raise ValueError(
                "prefix_cache_group names tenants to share with: it needs "
                "`prefix_cache: shared` (or leave prefix_cache unset)"
            )
        return self


class AuthSpec(Strict):
    """Who may call the API (gateway/edge/auth.py, gateway/tenants/): keys of the `default` tenant
    from a file (a Kubernetes Secret), tenants' keys in `tenants`, keys created at run time
    in Redis, and separate admin keys for /admin."""

    keys_file: str = Field(
        "",
        description="File of API keys of the `default` tenant, one per line (blank lines and "
        "# comments ignored); a file with no keys refuses them all. Authentication is on "
        "when this or `tenants` is set: every /v1 request then needs "
        "`Authorization: Bearer <key>`. Neither: no authentication (all `default`).",
    )
    check_interval_s: float = Field(
        2.0, gt=0, description="How often the key files are checked for changes (rotation)."
    )
    admin_keys_file: str = Field(
        "",
        description="File of admin keys (same format) for /admin/*; admin keys are not "
        "valid on /v1. Neither this nor `admin_keys`: /admin answers 401 to everyone.",
    )
    admin_keys: tuple[AdminKeySpec, ...] = Field((), description="Admin keys, hashed.")
    key_cache_ttl_s: float = Field(
        5.0,
        ge=0,
        le=300,
        description="How long a key created at run time (in Redis) is remembered in "
        "process, found or not: a revoked key stops working within this time.",
    )


class ModelSpec(Strict):
    """A model alias clients name in `model`: backed by one pool, or routable (`tiering`),
    when the gateway chooses a tier per request."""

    pool: Name | None = None
    tiering: Name | None = Field(
        None, description="Routable alias: the `tiering` entry that chooses its tier."
    )
    description: str = ""
    canonicalize: CanonicalizeSpec | None = Field(
        None, description="Overrides the top-level `canonicalize` for this model."
    )
    fallbacks: tuple[Name, ...] = Field(
        (),
        description="Model aliases tried in order when this one cannot answer (every "
        "replica down, open or full, or failing after retries); reported in X-Gateway-Fallback.",
    )
    defaults: dict[str, Any] = Field(
        {},
        description="Request fields set when a request to this alias does not send them "
        "(e.g. `temperature`, `stop`): for clients whose requests cannot be configured. "
        "Not `model`, `messages`, `stream` or `tools`.",
    )

    @model_validator(mode="after")
    def _pool_or_tiering(self) -> ModelSpec:
        if (self.pool is None) == (self.tiering is None):
            raise ValueError("give exactly one of `pool` (a fixed model) or `tiering` (routable)")
        reserved = {"model", "messages", "prompt", "input", "stream", "tools"} & set(self.defaults)
        if reserved:
            raise ValueError(f"`defaults` cannot set {', '.join(sorted(reserved))}")
        return self


class Policy(Strict):
    version: Literal[1] = 1
    server: ServerSpec = ServerSpec()
    limits: LimitsSpec = LimitsSpec()
    timeouts: TimeoutsSpec = TimeoutsSpec()
    health: HealthSpec = HealthSpec()
    state: StateSpec = StateSpec()
    auth: AuthSpec = AuthSpec()
    sessions: SessionsSpec = SessionsSpec()
    trimming: TrimmingSpec = TrimmingSpec()
    routing: RoutingSpec = RoutingSpec()
    resilience: ResilienceSpec = ResilienceSpec()
    telemetry: TelemetrySpec = TelemetrySpec()
    canonicalize: CanonicalizeSpec = CanonicalizeSpec()
    quota: QuotaSpec = QuotaSpec()
    approvals: ApprovalsSpec = ApprovalsSpec()
    tool_calls: ToolCallsSpec = ToolCallsSpec()
    pools: dict[Name, PoolSpec] = Field(min_length=1)
    models: dict[Name, ModelSpec] = Field(min_length=1)
    tiering: dict[Name, TieringSpec] = Field(
        default_factory=dict, description="Tier choice for routable model aliases, by name."
    )
    tenants: dict[TenantName, TenantSpec] = Field(
        default_factory=dict,
        description="Tenants by name: their keys and settings. Keys of `auth.keys_file` "
        "belong to the tenant `default` (which may be listed here for its settings).",
    )
