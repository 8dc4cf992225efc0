"""The policy's strict schema: unknown keys, wrong types and bad values are rejected.

These are raw, frozen configuration records. gateway/replicas.py builds the runtime
objects (pools with live replica state) from them once, at start-up.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from gateway.policy.volatile_presets import PRESETS


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$", max_length=128)]


class ServerSpec(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)


class LimitsSpec(Strict):
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0, description="Larger request bodies get 413.")


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
    load: float = Field(1.0, ge=0, description="Per block of recent work above the tolerated mean.")
    queue: float = Field(0.25, ge=0, description="Per request in flight or waiting at the replica.")
    session: float = Field(8.0, ge=0, description="For leaving the replica the session uses.")


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
    max_waiting: int = Field(32, ge=1, description="A replica with this many queued is saturated.")
    max_kv_usage: float = Field(
        0.98, gt=0, le=1, description="KV usage at which a replica is saturated."
    )
    scrape_interval_s: float = Field(1.0, gt=0, description="How often engines' /metrics are read.")
    request_log: str | None = Field(
        None, description="JSONL file of routed requests, for `gateway replay` (off if unset)."
    )


class VolatilePattern(Strict):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")] = Field(
        description="Placeholder name; without `regex`, a preset: " + ", ".join(sorted(PRESETS))
    )
    regex: str | None = Field(None, description="Python regex; defaults to the preset's.")

    @model_validator(mode="after")
    def _regex_or_preset(self) -> VolatilePattern:
        if self.regex is None and self.name not in PRESETS:
            raise ValueError(
                f"no preset named {self.name!r}: give a regex or one of {sorted(PRESETS)}"
            )
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"not a valid regex: {exc}") from None
        return self


class VolatileSpec(Strict):
    patterns: tuple[VolatilePattern, ...] = Field(min_length=1)
    placement: Literal["trailing_system", "last_user"] = Field(
        "trailing_system",
        description="Where the cut values go: a final system note, or the last user message.",
    )
    note_prefix: str = "Current values:"


class CanonicalizeSpec(Strict):
    sort_tools: bool = Field(True, description="Order tools by function name.")
    sort_schema_keys: bool = Field(True, description="Serialise tool schemas with sorted keys.")
    volatile: VolatileSpec | None = Field(
        None, description="Move volatile values out of the system prompt (off unless set)."
    )
    detect_prefix_changes: bool = Field(
        True, description="Report, per session, when the system prompt or tools change."
    )


class BreakerSpec(Strict):
    """A circuit breaker per replica: connect errors, timeouts and 5xx count; 4xx and
    clients going away never do."""

    consecutive_failures: int = Field(5, ge=1, description="Failures in a row that open it.")
    error_rate: float = Field(
        0.5, gt=0, le=1, description="Or this share of failures over `window_s` opens it."
    )
    window_s: float = Field(60.0, gt=0, description="The window the error rate is taken over.")
    min_calls: int = Field(
        20, ge=1, description="Calls in the window before the error rate is judged."
    )
    open_s: float = Field(15.0, gt=0, description="How long it stays open before a trial.")
    half_open_trials: int = Field(
        1, ge=1, description="Trial requests let through at once while half-open."
    )


class RetrySpec(Strict):
    attempts: int = Field(
        3, ge=1, description="Tries per request, the first included; only before the first byte."
    )
    backoff_base_s: float = Field(0.1, ge=0, description="Exponential backoff, full jitter.")
    backoff_max_s: float = Field(2.0, ge=0, description="The longest wait between two tries.")
    retry_after_cap_s: float = Field(
        5.0, ge=0, description="An engine's Retry-After is honoured up to this."
    )
    on_status: tuple[int, ...] = Field(
        (429, 502, 503, 504), description="Engine statuses that are retried (on another replica)."
    )


class AdmissionSpec(Strict):
    max_inflight_per_replica: int = Field(
        64, ge=1, description="Requests in flight to one replica before it counts as full."
    )
    on_saturated: Literal["reject", "wait"] = Field(
        "reject",
        description="Every replica full (in flight, or the engine's queue at "
        "`routing.max_waiting`): answer 429 at once, or wait up to `wait_s` for room.",
    )
    wait_s: float = Field(2.0, gt=0, description="Longest wait for room with `on_saturated: wait`.")
    retry_after_s: int = Field(1, ge=1, description="Retry-After on the 429.")


class ResponseCacheSpec(Strict):
    enabled: bool = Field(
        False,
        description="Keep deterministic answers (temperature 0, one choice, not streamed) "
        "and serve the same request's answer when nothing else can.",
    )
    ttl_s: int = Field(3600, ge=1, description="How long a kept answer can be served.")


class ResilienceSpec(Strict):
    breaker: BreakerSpec = BreakerSpec()
    retries: RetrySpec = RetrySpec()
    admission: AdmissionSpec = AdmissionSpec()
    response_cache: ResponseCacheSpec = ResponseCacheSpec()


class StateSpec(Strict):
    redis_url: str = Field(
        "",
        description=(
            "redis:// or rediss:// URL of the state store; empty starts an embedded, "
            "durable Redis in embedded_dir."
        ),
    )
    embedded_dir: str = Field(".run/state", description="Data directory of the embedded Redis.")
    max_connections: int = Field(256, ge=1, description="Size of the blocking connection pool.")


class SessionsSpec(Strict):
    enabled: bool = Field(True, description="Checkpoint every turn of a keyed session in Redis.")
    key_from: tuple[Literal["header", "metadata", "user"], ...] = Field(
        ("header",),
        description="Where a session key is read, first found wins: the X-Session-Id header, "
        "`metadata.session_id`, or the `user` field.",
    )
    ttl_s: int = Field(
        7 * 86_400,
        ge=60,
        description="A session's checkpoints expire this long after its last turn.",
    )
    on_store_outage: Literal["fail_open", "fail_closed"] = Field(
        "fail_open",
        description="Redis unreachable: serve session turns unsaved (X-Gateway-Degraded: "
        "checkpoint), or refuse them with 503.",
    )


class StateToolSpec(Strict):
    entity: Name = Field(description="The kind of entity this tool's result is a snapshot of.")
    id_field: str | None = Field(None, description="Field of the result naming the entity.")
    id_argument: str | None = Field(
        None, description="Argument of the call naming the entity (when the result does not)."
    )
    schema_: dict[str, Any] | None = Field(
        None,
        alias="schema",
        description="JSON Schema a snapshot must meet; one that fails is sent whole.",
    )

    @model_validator(mode="after")
    def _named_somehow(self) -> StateToolSpec:
        if (self.id_field is None) == (self.id_argument is None):
            raise ValueError("give exactly one of id_field or id_argument")
        return self


class TrimmingSpec(Strict):
    enabled: bool = Field(False, description="Trim session contexts (off unless turned on).")
    high_water_tokens: int = Field(
        6000, ge=64, description="History tokens (after system + tools) that trigger compaction."
    )
    low_water_tokens: int = Field(
        2500, ge=64, description="Compaction keeps a tail of at most this many history tokens."
    )
    tokenizer: str | None = Field(
        None, description="The engine model's tokenizer.json for token counts."
    )
    state_tools: dict[str, StateToolSpec] = Field(
        default_factory=dict,
        description="Tools whose results are snapshots of an entity, by tool name.",
    )

    @model_validator(mode="after")
    def _low_below_high(self) -> TrimmingSpec:
        if self.low_water_tokens >= self.high_water_tokens:
            raise ValueError("low_water_tokens must be below high_water_tokens")
        return self


ResponseFormatKind = Literal["text", "json_object", "json_schema", "enum", "small_object"]


class RuleWhen(Strict):
    """Matchers of one rule; every one given must hold (a conjunction)."""

    task: tuple[str, ...] | None = Field(
        None, description="Task label (X-Task header or `metadata.task`) is one of these."
    )
    tools: Literal["present", "absent"] | None = Field(
        None, description="The request offers tools, or offers none."
    )
    response_format: tuple[ResponseFormatKind, ...] | None = Field(
        None,
        description="The requested output is one of these kinds: `enum` is a JSON schema "
        "whose answer is an enum (or an object of one enum), `small_object` an object of "
        "at most `small_object_fields` scalar fields; both are also `json_schema`.",
    )
    max_tokens_at_most: int | None = Field(
        None, ge=1, description="`max_tokens`/`max_completion_tokens` set and at most this."
    )
    prompt_tokens_at_most: int | None = Field(
        None, ge=1, description="Estimated prompt tokens (messages and tools) at most this."
    )
    last_user_matches: str | None = Field(
        None, description="Python regex searched in the last user message."
    )

    @model_validator(mode="after")
    def _something_to_match(self) -> RuleWhen:
        if all(value is None for value in self.__dict__.values()):
            raise ValueError("a rule needs at least one matcher in `when`")
        if self.last_user_matches is not None:
            try:
                re.compile(self.last_user_matches)
            except re.error as exc:
                raise ValueError(f"last_user_matches is not a valid regex: {exc}") from None
        return self


class TierRule(Strict):
    name: Name = Field(description="Reported in X-Gateway-Route-Reason as `rule:<name>`.")
    when: RuleWhen
    then: Name = Field(description="The tier this rule sends the request to.")


class LearnedRouterSpec(Strict):
    enabled: bool = Field(True, description="Score requests no rule decided.")
    artifact: str | None = Field(
        None, description="Router artifact from `gateway route-train`; unset: the shipped one."
    )
    threshold: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Send to the lowest tier when the score (probability that it is good "
        "enough) is at least this; else to the highest.",
    )


class GuardrailSpec(Strict):
    """Deterministic checks of the answer, applied to every request of the route."""

    json_schema: dict[str, Any] | None = Field(None, description="JSON Schema the answer meets.")
    enum: tuple[str, ...] | None = Field(None, min_length=1, description="The answer is one of.")
    regex: str | None = Field(None, description="Python regex the whole answer matches.")
    parses_as: Literal["json", "python"] | None = Field(
        None, description="The answer parses as JSON, or as Python (`ast.parse`)."
    )

    @model_validator(mode="after")
    def _valid(self) -> GuardrailSpec:
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex is not valid: {exc}") from None
        if self.json_schema is not None:
            from jsonschema import Draft202012Validator
            from jsonschema.exceptions import SchemaError

            try:
                Draft202012Validator.check_schema(self.json_schema)
            except SchemaError as exc:
                raise ValueError(f"json_schema is not a valid JSON Schema: {exc.message}") from None
        return self


class CascadeSpec(Strict):
    enabled: bool = Field(
        True,
        description="Verifiable requests (a JSON-schema `response_format`, or guardrails) "
        "start on the lowest tier and move up once when the answer fails its checks.",
    )
    on_fail: Literal["escalate", "error"] = Field(
        "escalate",
        description="A failed check: retry once on the highest tier, or answer 502 "
        "`output_check_failed`. A failure on the highest tier is always an error.",
    )
    structured_outputs: bool = Field(
        True,
        description="Ask engines that support it (pool `structured_outputs`) to constrain "
        "the answer to the checks, instead of hoping.",
    )


class StickinessSpec(Strict):
    margin: float = Field(
        0.1,
        ge=0,
        le=1,
        description="A session leaves its tier only when the router score is this far past "
        "the threshold.",
    )
    cache_weight: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Added to the margin, times the share of the prompt already cached on "
        "the session tier's replicas.",
    )
    ttl_s: int = Field(86_400, ge=60, description="How long a session's tier is remembered.")


class TieringSpec(Strict):
    """How a routable model alias chooses a tier per request."""

    tiers: dict[Name, Name] = Field(
        min_length=1, description="Tier name to pool, cheapest first (e.g. small, then large)."
    )
    default_tier: Name | None = Field(
        None, description="When neither a rule nor the learned router decides; unset: the highest."
    )
    rules: tuple[TierRule, ...] = Field((), description="Tried in order; the first match decides.")
    learned: LearnedRouterSpec | None = LearnedRouterSpec()
    cascade: CascadeSpec = CascadeSpec()
    guardrails: GuardrailSpec | None = None
    small_object_fields: int = Field(
        4, ge=1, description="A response-format object of at most this many fields is small."
    )
    stickiness: StickinessSpec = StickinessSpec()

    @model_validator(mode="after")
    def _tiers_known(self) -> TieringSpec:
        names = list(self.tiers)
        for rule in self.rules:
            if rule.then not in self.tiers:
                raise ValueError(f"rule {rule.name!r} sends to unknown tier {rule.then!r}: {names}")
        if self.default_tier is not None and self.default_tier not in self.tiers:
            raise ValueError(f"default_tier {self.default_tier!r} is not one of {names}")
        return self

    @property
    def lowest(self) -> str:
        return next(iter(self.tiers))

    @property
    def highest(self) -> str:
        return list(self.tiers)[-1]


class ReplicaSpec(Strict):
    url: BaseUrl


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
    structured_outputs: bool = Field(
        True, description="The engines constrain output to a schema, choice or regex (vLLM)."
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

    @model_validator(mode="after")
    def _pool_or_tiering(self) -> ModelSpec:
        if (self.pool is None) == (self.tiering is None):
            raise ValueError("give exactly one of `pool` (a fixed model) or `tiering` (routable)")
        return self


class Policy(Strict):
    version: Literal[1] = 1
    server: ServerSpec = ServerSpec()
    limits: LimitsSpec = LimitsSpec()
    timeouts: TimeoutsSpec = TimeoutsSpec()
    health: HealthSpec = HealthSpec()
    state: StateSpec = StateSpec()
    sessions: SessionsSpec = SessionsSpec()
    trimming: TrimmingSpec = TrimmingSpec()
    routing: RoutingSpec = RoutingSpec()
    resilience: ResilienceSpec = ResilienceSpec()
    canonicalize: CanonicalizeSpec = CanonicalizeSpec()
    pools: dict[Name, PoolSpec] = Field(min_length=1)
    models: dict[Name, ModelSpec] = Field(min_length=1)
    tiering: dict[Name, TieringSpec] = Field(
        default_factory=dict, description="Tier choice for routable model aliases, by name."
    )
