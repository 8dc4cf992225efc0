"""The policy's strict schema: unknown keys, wrong types and bad values are rejected.

`Policy`, the whole file, and the small sections that live nowhere else (server, limits,
timeouts, health, models); each larger section has a module of its own beside this one
(routing.py, pools.py, auth.py, sessions.py, resilience.py, ...).

These are raw, frozen configuration records. gateway/runtime.py builds the runtime objects
(pools with live replica state, the router, the pipeline) from them at start-up and on
every policy reload (gateway/reload.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from gateway.policy.approvals import ApprovalsSpec
from gateway.policy.auth import AuthSpec, TenantName, TenantSpec
from gateway.policy.base import HostName, Name, Strict
from gateway.policy.canonicalize import CanonicalizeSpec
from gateway.policy.pools import PoolSpec
from gateway.policy.quota import QuotaSpec
from gateway.policy.resilience import ResilienceSpec
from gateway.policy.routing import RoutingSpec
from gateway.policy.sessions import SessionsSpec, StateSpec, TrimmingSpec
from gateway.policy.telemetry import TelemetrySpec
from gateway.policy.tiering import TieringSpec
from gateway.policy.tool_calls import ToolCallsSpec


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
        "An output limit under this but above the engines' whole context window is sent as "
        "the window (X-Gateway-Max-Tokens).",
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
    stored_bytes: int | None = Field(
        None,
        ge=1,
        description="Most bytes a tenant's stored conversations (sessions with their tool "
        "sets and snapshots, forks, stored responses, compactions, answers the response cache "
        "keeps, feedback, turns held for approval) may hold in Redis; at it, a session "
        "turn whose client sent its whole history is served unsaved (X-Gateway-Degraded: "
        "stored_bytes), and requests that need the store or ask to be stored (delta mode, "
        "`store`, forks, compactions, feedback) get 429 stored_bytes_exceeded with "
        "Retry-After until some expire (`sessions.ttl_s` after their last write) or are "
        "deleted; requests that store nothing are served (gateway/state/stored_bytes.py). "
        "Unset, the default: "
        "no cap. Set it for every tenant that is not trusted, so that together they stay "
        "below Redis's maxmemory.",
    )
    media_url_hosts: tuple[HostName, ...] = Field(
        (),
        description="Hosts whose URLs a chat request may name for an image, audio or video "
        "part: the engine (a multimodal vLLM) fetches them, from inside the cluster. Empty, "
        "the default: media only inline, as base64 `data:` URLs; a part naming any other URL "
        "is 400 unsupported_media_url (gateway/untrusted/media_urls.py). Exact host names, "
        "no scheme, port or wildcard; name only hosts that serve public media, and keep "
        "the engines' redirects off (VLLM_MEDIA_URL_ALLOW_REDIRECTS=0), or a listed host "
        "could send the engine elsewhere.",
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
        "replica down, open or full, failing after retries, or a prompt its engines' window "
        "cannot hold); reported in X-Gateway-Fallback.",
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
