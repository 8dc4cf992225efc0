"""Which models a tenant may use, and the load-time checks of its settings against the
rest of the policy (gateway/policy/tenant_overrides.py says what the settings mean).

Run on the validated policy (gateway/policy/loader.py), after the cross-references of the
raw mapping held, so every model, pool and tiering named here exists. A problem is the
key path inside the policy and what is wrong there.
"""

from __future__ import annotations

from gateway.policy.auth import TenantSpec
from gateway.policy.schema import Policy
from gateway.policy.tenant_overrides import merged

Location = tuple[str | int, ...]


def tiers_of(policy: Policy, alias: str) -> tuple[str, ...]:
    """The tiers a model alias is served on, cheapest first: a routable alias's tiering
    tiers, a fixed alias's pool tier."""
    model = policy.models[alias]
    if model.tiering is not None:
        return tuple(policy.tiering[model.tiering].tiers)
    assert model.pool is not None  # one of the two, by the schema
    return (policy.pools[model.pool].tier,)


def may_use(policy: Policy, spec: TenantSpec | None, alias: str) -> bool:
    """A tenant without an entry may use every model."""
    if spec is None:
        return True
    if spec.models is not None and alias not in spec.models:
        return False
    return spec.tiers is None or any(tier in spec.tiers for tier in tiers_of(policy, alias))


def tenant_setting_problems(policy: Policy) -> list[tuple[Location, str]]:
    problems: list[tuple[Location, str]] = []
    for name, spec in policy.tenants.items():
        where: Location = ("tenants", name)
        problems += _tier_problems(policy, spec, where)
        problems += _fallback_problems(policy, spec, where)
        problems += _trimming_problems(policy, spec, where)
    return problems


def _tier_problems(policy: Policy, spec: TenantSpec, where: Location) -> list[tuple[Location, str]]:
    """A tier named that no pool or tiering defines; a model the tenant may use that no
    allowed tier serves (it would answer nothing: leave it out of `models` instead)."""
    if spec.tiers is None:
        return []
    known = {pool.tier for pool in policy.pools.values()}
    known |= {tier for route in policy.tiering.values() for tier in route.tiers}
    problems: list[tuple[Location, str]] = []
    for i, tier in enumerate(spec.tiers):
        if tier not in known:
            message = f"tier {tier!r} is not defined (expected one of: {', '.join(sorted(known))})"
            problems.append(((*where, "tiers", i), message))
    listed = spec.models if spec.models is not None else tuple(policy.models)
    for i, alias in enumerate(listed):
        served = tiers_of(policy, alias)
        if any(tier in spec.tiers for tier in served):
            continue
        message = (
            f"model {alias!r} is served only on tier(s) {', '.join(served)}, none of which "
            "this tenant may use: allow one of them in `tiers`, or "
        )
        if spec.models is not None:
            problems.append(((*where, "models", i), message + "leave the model out of `models`"))
        else:
            problems.append(((*where, "tiers"), message + "list the tenant's `models` without it"))
    return problems


def _fallback_problems(
    policy: Policy, spec: TenantSpec, where: Location
) -> list[tuple[Location, str]]:
    problems: list[tuple[Location, str]] = []
    known = ", ".join(sorted(policy.models))

    def unusable(alias: str) -> str | None:
        if alias not in policy.models:
            return f"model {alias!r} is not defined (expected one of: {known})"
        if not may_use(policy, spec, alias):
            return f"this tenant may not use model {alias!r} (its `models` or `tiers`)"
        return None

    for alias, fallbacks in spec.fallbacks.items():
        if (problem := unusable(alias)) is not None:
            problems.append(((*where, "fallbacks", alias), problem))
            continue
        for i, fallback in enumerate(fallbacks):
            problem = f"{fallback!r} is this model itself" if fallback == alias else None
            if (problem := problem or unusable(fallback)) is not None:
                problems.append(((*where, "fallbacks", alias, i), problem))
    return problems


def _trimming_problems(
    policy: Policy, spec: TenantSpec, where: Location
) -> list[tuple[Location, str]]:
    trimming = merged(policy.trimming, spec.trimming)
    if trimming.low_water_tokens < trimming.high_water_tokens:
        return []
    override = spec.trimming
    field = "low_water_tokens"
    if override is not None and override.low_water_tokens is None:
        field = "high_water_tokens"  # the tenant's own value is the one to fix
    message = (
        f"low_water_tokens ({trimming.low_water_tokens}) must be below high_water_tokens "
        f"({trimming.high_water_tokens}) once merged over the top-level `trimming`"
    )
    return [((*where, "trimming", field), message)]
