"""Where agent context lives, in the policy: the state store (`state`), session
checkpoints (`sessions`) and context trimming (`trimming`)."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, field_validator, model_validator

from gateway.policy.base import Name, Strict
from gateway.untrusted.schemas import ClientSchema, UnsafeSchema, prepare

_REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})  # what redis-py's from_url takes


class StateSpec(Strict):
    redis_url: str = Field(
        "",
        description=(
            "redis://, rediss:// or unix:// URL of the state store; empty starts an "
            "embedded, durable Redis in embedded_dir."
        ),
    )
    embedded_dir: str = Field(".run/state", description="Data directory of the embedded Redis.")
    max_connections: int = Field(
        256,
        ge=1,
        description="Size of the blocking connection pool; in cluster mode, the most commands "
        "in flight at once (each node's pool has this many connections at most).",
    )
    cluster: bool = Field(
        False,
        description="The Redis at redis_url is one node of a Redis Cluster: the others are "
        "discovered from it, and keys are hash-tagged so a session lives in one slot.",
    )

    @field_validator("redis_url")
    @classmethod
    def _a_redis_url(cls, url: str) -> str:
        """Refused here, with the file and line, rather than by redis-py when the gateway
        starts. The URL may hold a password: no message repeats it."""
        if not url:
            return url
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018  # raises on a port that is not a number
        except ValueError:
            raise ValueError("not a URL: its port is not a number") from None
        if parts.scheme not in _REDIS_SCHEMES:
            raise ValueError(
                "must start with redis://, rediss:// or unix:// (empty: the embedded Redis)"
            )
        return url

    @model_validator(mode="after")
    def _cluster_needs_a_node(self) -> StateSpec:
        if not self.cluster:
            return self
        if not self.redis_url:
            raise ValueError("state.cluster needs redis_url: any node of the cluster")
        parts = urlsplit(self.redis_url)
        if parts.scheme == "unix":
            raise ValueError("state.cluster needs a node's redis:// or rediss:// URL")
        database = parts.path.strip("/")
        if database not in ("", "0"):
            raise ValueError(
                f"a Redis Cluster has only database 0; redis_url names database {database}"
            )
        return self


class SessionsSpec(Strict):
    enabled: bool = Field(True, description="Checkpoint every turn of a keyed session in Redis.")
    key_from: tuple[Literal["header", "metadata", "user", "client"], ...] = Field(
        ("header",),
        description="Where a session key is read, first found wins: the X-Session-Id header, "
        "`metadata.session_id`, the `user` field, or `client`: the conversation id a client "
        "sends of its own accord (`prompt_cache_key`: Codex CLI's session; Claude Code's, "
        "from `metadata.user_id`).",
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
        description="JSON Schema (2020-12) a snapshot must meet; one that fails is sent "
        "whole. References only inside it (`#...`), patterns in RE2 syntax.",
    )
    # Prepared once, when the policy loads (gateway/untrusted/schemas.py).
    _checked_schema: ClientSchema | None = PrivateAttr(None)

    @field_validator("schema_")
    @classmethod
    def _bounded_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None:
            try:
                prepare(schema)
            except UnsafeSchema as exc:
                raise ValueError(f"not a JSON Schema the gateway can apply: {exc.reason}") from None
        return schema

    @model_validator(mode="after")
    def _named_somehow(self) -> StateToolSpec:
        if (self.id_field is None) == (self.id_argument is None):
            raise ValueError("give exactly one of id_field or id_argument")
        if self.schema_ is not None:
            self._checked_schema = prepare(self.schema_)
        return self

    @property
    def checked_schema(self) -> ClientSchema | None:
        return self._checked_schema


class MaskingSpec(Strict):
    """Old, large tool outputs in the kept tail replaced by a stub with their artifact
    handle, a chunk at a time (gateway/trimming/masking.py)."""

    keep_last_tool_uses: int = Field(
        3, ge=0, description="The most recent tool results are never masked."
    )
    min_tokens: int = Field(
        200, ge=1, description="Only tool results at least this long are masked."
    )
    clear_at_least_tokens: int = Field(
        1000,
        ge=1,
        description="Mask only in chunks of at least this many tokens: each masking changes "
        "the context from the first masked result on, so it must be worth the recompute.",
    )


class BudgetSpec(Strict):
    """Watermarks that follow the engine and the conversation instead of staying fixed
    (gateway/trimming/budget.py): the engine's context caps the history, the kept tail
    grows to hold the conversation's own typical tool outputs, and a compaction must free
    a chunk worth the cache it invalidates."""

    context_tokens: int | None = Field(
        None,
        ge=256,
        description="The engine's context window in tokens. The history is kept under "
        "context_share of it less the system prompt, whatever the watermarks say, so a "
        "session never outgrows its engine. Unset: the smallest window the route's engines "
        "report (vLLM's max_model_len in /v1/models); no cap while none has.",
    )
    context_share: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="The share of context_tokens the history may fill; the rest is for the "
        "system prompt's tools and the answer.",
    )
    tool_outputs_kept: int = Field(
        0,
        ge=0,
        le=50,
        description="The low-water mark grows to hold this many of the conversation's median "
        "tool output, and the high-water mark with it (0: the fixed watermarks).",
    )
    clear_at_least_tokens: int = Field(
        0,
        ge=0,
        description="A compaction must free at least this many history tokens (the high-water "
        "mark is at least the low-water mark plus this); one that would free less waits, "
        "unless the context cap demands it.",
    )


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
    masking: MaskingSpec | None = Field(
        None,
        description="Mask old, large tool outputs in the kept tail before compaction is "
        "needed (unset: off).",
    )
    budget: BudgetSpec | None = Field(
        None,
        description="Watermarks relative to the engine's context and the conversation's tool "
        "outputs (unset: the fixed watermarks).",
    )

    @model_validator(mode="after")
    def _low_below_high(self) -> TrimmingSpec:
        if self.low_water_tokens >= self.high_water_tokens:
            raise ValueError("low_water_tokens must be below high_water_tokens")
        return self
