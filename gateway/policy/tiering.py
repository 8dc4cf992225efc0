"""The policy's `tiering` entries: tiers, rules, the learned router, checks, stickiness."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from gateway.policy.base import Name, Strict
from gateway.untrusted.regex import LinearRegex, UnsafePattern
from gateway.untrusted.schemas import ClientSchema, UnsafeSchema, prepare

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
        None,
        description="Regex searched in the last user message, in RE2 syntax (linear time: "
        "no backreferences, no lookaround).",
    )

    @field_validator("last_user_matches")
    @classmethod
    def _linear_regex(cls, pattern: str | None) -> str | None:
        return _linear(pattern, "last_user_matches is not a valid regex")

    @model_validator(mode="after")
    def _something_to_match(self) -> RuleWhen:
        if all(value is None for value in self.__dict__.values()):
            raise ValueError("a rule needs at least one matcher in `when`")
        return self


class TierRule(Strict):
    name: Name = Field(description="Reported in X-Gateway-Route-Reason as `rule:<name>`.")
    when: RuleWhen
    then: Name = Field(description="The tier this rule sends the request to.")


class ShadowRouterSpec(Strict):
    """A candidate router tried on live traffic without acting on it."""

    artifact: str = Field(description="The candidate's artifact from `gateway route-train`.")
    threshold: float = Field(
        0.5, ge=0, le=1, description="The candidate's threshold, as `learned.threshold`."
    )
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of the route's requests the candidate scores (each costs about "
        "0.1-0.2 ms of CPU after its answer is sent).",
    )


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
    shadow: ShadowRouterSpec | None = Field(
        None,
        description="Score every request of the route with a candidate router too, after "
        "the answer is sent, and write its decision beside the live one in the request log "
        "(`shadow`), never acting on it; `gateway route-eval --shadow LOG` says whether it "
        "would have done better.",
    )


class GuardrailSpec(Strict):
    """Deterministic checks of the answer, applied to every request of the route."""

    json_schema: dict[str, Any] | None = Field(
        None,
        description="JSON Schema (2020-12) the answer meets; references only inside it "
        "(`#...`), patterns in RE2 syntax.",
    )
    enum: tuple[str, ...] | None = Field(None, min_length=1, description="The answer is one of.")
    regex: str | None = Field(
        None,
        description="Regex the whole answer matches, in RE2 syntax (linear time: no "
        "backreferences, no lookaround).",
    )
    parses_as: Literal["json", "python"] | None = Field(
        None, description="The answer parses as JSON, or as Python (`ast.parse`)."
    )
    # Compiled once, when the policy loads (gateway/untrusted/).
    _checked_schema: ClientSchema | None = PrivateAttr(None)
    _compiled_regex: LinearRegex | None = PrivateAttr(None)

    @field_validator("regex")
    @classmethod
    def _linear_regex(cls, pattern: str | None) -> str | None:
        return _linear(pattern, "regex is not valid")

    @field_validator("json_schema")
    @classmethod
    def _bounded_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None:
            try:
                _official_check(schema)
                prepare(schema)
            except UnsafeSchema as exc:
                raise ValueError(f"json_schema is not a valid JSON Schema: {exc.reason}") from None
        return schema

    @model_validator(mode="after")
    def _compiled(self) -> GuardrailSpec:
        if self.json_schema is not None:
            self._checked_schema = prepare(self.json_schema)
        if self.regex is not None:
            self._compiled_regex = LinearRegex(self.regex)
        return self

    @property
    def checked_schema(self) -> ClientSchema | None:
        return self._checked_schema

    @property
    def compiled_regex(self) -> LinearRegex | None:
        return self._compiled_regex


def _linear(pattern: str | None, problem: str) -> str | None:
    if pattern is not None:
        try:
            LinearRegex(pattern)
        except UnsafePattern as exc:
            raise ValueError(
                f"{problem}: {exc.reason} (RE2 syntax, matched in linear time)"
            ) from None
    return pattern


def _official_check(schema: dict[str, Any]) -> None:
    """The whole meta-schema, as `jsonschema` checks it: affordable once, at load."""
    from jsonschema import Draft202012Validator

    # Without format checks: `format: regex` would judge patterns by Python's `re`, and
    # they are RE2's (the bounded check below judges them).
    meta = Draft202012Validator(Draft202012Validator.META_SCHEMA)
    document = {key: value for key, value in schema.items() if key != "$schema"}
    error = next(iter(meta.iter_errors(document)), None)
    if error is not None:
        raise UnsafeSchema(error.message)


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
