"""Each tenant's settings merged over the policy's defaults, built once per policy (at
start-up and on every reload, with the runtime: a reload that changes a default reaches
every tenant that did not override it), so a request costs one dict lookup and no merge.

A tenant the policy does not list (the `default` tenant of a keys file, or everyone when
authentication is off) gets `TenantPolicies.default`: the top-level sections themselves,
the very objects the gateway used before tenants had settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.policy import Policy
from gateway.policy.auth import TenantSpec
from gateway.policy.schema import LimitsSpec
from gateway.policy.sessions import TrimmingSpec
from gateway.policy.tenant_checks import may_use, tiers_of
from gateway.policy.tenant_overrides import TierClamps, merged, tier_clamps
from gateway.tenants.cache_scope import CacheScope, scope_of
from gateway.tenants.identity import DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class TenantSettings:
    name: str
    limits: LimitsSpec
    trimming: TrimmingSpec
    # Every model alias the tenant may use -> the fallbacks it is served by, in order.
    fallbacks: Mapping[str, tuple[str, ...]]
    tier_clamps: TierClamps
    models: frozenset[str] | None  # None: every alias
    tiers: tuple[str, ...] | None  # None: every tier
    capture_content: bool  # effective: the policy captures, and the tenant opted in
    cache_scope: CacheScope  # whom its prompts share the engines' prefix cache with

    def public(self) -> dict[str, Any]:
        """What `GET /admin/tenants` shows: the settings in effect, overrides merged."""
        return {
            "object": "tenant",
            "name": self.name,
            "models": sorted(self.models) if self.models is not None else None,
            "tiers": list(self.tiers) if self.tiers is not None else None,
            "capture_content": self.capture_content,
            "limits": self.limits.model_dump(),
            "trimming": {
                "enabled": self.trimming.enabled,
                "high_water_tokens": self.trimming.high_water_tokens,
                "low_water_tokens": self.trimming.low_water_tokens,
            },
            "fallbacks": {alias: list(chain) for alias, chain in self.fallbacks.items() if chain},
            **self.cache_scope.public(),
        }


class TenantPolicies:
    def __init__(self, policy: Policy) -> None:
        self.default = _settings(policy, DEFAULT_TENANT, None)
        self._listed = {
            name: _settings(policy, name, spec) for name, spec in policy.tenants.items()
        }

    def of(self, tenant: str) -> TenantSettings:
        return self._listed.get(tenant, self.default)

    def listed(self) -> list[TenantSettings]:
        """Every tenant's settings, `default` included, by name."""
        every = {DEFAULT_TENANT: self.default, **self._listed}
        return [every[name] for name in sorted(every)]


def _settings(policy: Policy, name: str, spec: TenantSpec | None) -> TenantSettings:
    capture = policy.telemetry.traces.capture_content
    # More than one tenant can send requests once the policy lists any besides `default`.
    multi_tenant = any(tenant != DEFAULT_TENANT for tenant in policy.tenants)
    scope = scope_of(
        name,
        spec.prefix_cache if spec is not None else None,
        spec.prefix_cache_group if spec is not None else None,
        multi_tenant=multi_tenant,
    )
    if spec is None:
        return TenantSettings(
            name,
            policy.limits,
            policy.trimming,
            {alias: model.fallbacks for alias, model in policy.models.items()},
            {},
            None,
            None,
            capture,
            scope,
        )
    usable = [alias for alias in policy.models if may_use(policy, spec, alias)]
    fallbacks = {
        alias: spec.fallbacks[alias]
        if alias in spec.fallbacks
        # A model's own fallbacks the tenant may not use are skipped: it is never served by
        # a model it could not ask for.
        else tuple(f for f in policy.models[alias].fallbacks if may_use(policy, spec, f))
        for alias in usable
    }
    clamps: TierClamps = {}
    if spec.tiers is not None:
        routes = {a: tiers_of(policy, a) for a in usable if policy.models[a].tiering is not None}
        clamps = tier_clamps(routes, frozenset(spec.tiers))
    return TenantSettings(
        name,
        merged(policy.limits, spec.limits),
        merged(policy.trimming, spec.trimming),
        fallbacks,
        clamps,
        frozenset(usable) if spec.models is not None or spec.tiers is not None else None,
        spec.tiers,
        capture and spec.capture_content,
        scope,
    )
