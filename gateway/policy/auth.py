"""The policy's `auth` and `tenants` sections: who may call the API, with which keys (kept
as SHA-256 digests only), and each tenant's settings over the top-level sections
(gateway/edge/auth.py, gateway/tenants/)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from gateway.policy.base import Name, Strict
from gateway.policy.quota import BudgetSpec, RateLimitSpec
from gateway.policy.tenant_overrides import LimitsOverride, TrimmingOverride
from gateway.untrusted.client_text import control_character

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
