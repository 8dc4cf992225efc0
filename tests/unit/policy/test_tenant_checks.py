"""A tenant's own settings (tiers, limits, trimming, fallbacks) are checked at load against
the rest of the policy, each problem named by its path and line."""

from __future__ import annotations

import pytest

from gateway.policy import Policy, PolicyError, parse_policy
from gateway.policy.schema import LimitsSpec
from gateway.policy.sessions import TrimmingSpec
from gateway.policy.tenant_overrides import (
    LimitsOverride,
    TrimmingOverride,
    clamp_tier,
    merged,
    tier_clamps,
)

BASE = """\
version: 1
pools:
  chat: {served_model: s, tier: small, replicas: [{url: "http://a.test:1"}]}
  big: {served_model: b, tier: large, replicas: [{url: "http://b.test:1"}]}
models:
  tiny: {pool: chat, fallbacks: [large]}
  large: {pool: big}
  auto: {tiering: auto}
tiering:
  auto: {tiers: {small: chat, large: big}, learned: null}
tenants:
  team:
"""


def policy_with(tenant: str) -> Policy:
    return parse_policy(BASE + "".join(f"    {line}\n" for line in tenant.splitlines()))


def problems_of(tenant: str) -> str:
    with pytest.raises(PolicyError) as caught:
        policy_with(tenant)
    return str(caught.value)


def test_good_overrides_load() -> None:
    policy = policy_with(
        "tiers: [small]\n"
        "models: [tiny, auto]\n"
        "limits: {max_messages: 8, max_body_bytes: 100000000}\n"
        "trimming: {enabled: true, high_water_tokens: 900, low_water_tokens: 300}\n"
        "fallbacks: {auto: [tiny], tiny: []}"
    )
    team = policy.tenants["team"]
    assert team.tiers == ("small",)
    assert team.limits == LimitsOverride(max_messages=8, max_body_bytes=100_000_000)
    assert team.fallbacks == {"auto": ("tiny",), "tiny": ()}


@pytest.mark.parametrize(
    ("tenant", "expected"),
    [
        (
            "tiers: [small, huge]",
            "<policy>:13: tenants.team.tiers[1]: tier 'huge' is not defined "
            "(expected one of: large, small)",
        ),
        (
            "tiers: [small]\nmodels: [tiny, large]",
            "tenants.team.models[1]: model 'large' is served only on tier(s) large, none of "
            "which this tenant may use: allow one of them in `tiers`, or leave the model out "
            "of `models`",
        ),
        (
            "tiers: [small]",
            "tenants.team.tiers: model 'large' is served only on tier(s) large, none of which "
            "this tenant may use: allow one of them in `tiers`, or list the tenant's `models` "
            "without it",
        ),
        (
            "fallbacks: {nope: [tiny]}",
            "tenants.team.fallbacks.nope: model 'nope' is not defined "
            "(expected one of: auto, large, tiny)",
        ),
        (
            "fallbacks: {tiny: [auto, tiny]}",
            "tenants.team.fallbacks.tiny[1]: 'tiny' is this model itself",
        ),
        (
            "models: [tiny, auto]\nfallbacks: {tiny: [large]}",
            "tenants.team.fallbacks.tiny[0]: this tenant may not use model 'large' "
            "(its `models` or `tiers`)",
        ),
        (
            "models: [tiny]\nfallbacks: {large: [tiny]}",
            "tenants.team.fallbacks.large: this tenant may not use model 'large'",
        ),
        (
            "trimming: {low_water_tokens: 6000}",
            "tenants.team.trimming.low_water_tokens: low_water_tokens (6000) must be below "
            "high_water_tokens (6000) once merged over the top-level `trimming`",
        ),
        (
            "trimming: {high_water_tokens: 2000}",
            "tenants.team.trimming.high_water_tokens: low_water_tokens (2500) must be below "
            "high_water_tokens (2000)",
        ),
        (
            "limits: {max_json_depth: 200}",
            "tenants.team.limits.max_json_depth: Input should be less than or equal to 128",
        ),
        ("limits: {max_bytes: 10}", "tenants.team.limits.max_bytes: unknown key"),
        ("trimming: {tokenizer: x.json}", "tenants.team.trimming.tokenizer: unknown key"),
    ],
)
def test_bad_overrides_are_named_at_load(tenant: str, expected: str) -> None:
    assert expected in problems_of(tenant)


def test_the_overrides_cover_the_sections_they_override() -> None:
    assert set(LimitsOverride.model_fields) == set(LimitsSpec.model_fields)
    assert set(TrimmingOverride.model_fields) <= set(TrimmingSpec.model_fields)


def test_a_merge_replaces_only_the_fields_given() -> None:
    default = LimitsSpec()
    assert merged(default, None) is default
    assert merged(default, LimitsOverride()) is default
    assert merged(default, LimitsOverride(max_tools=256)) is default  # the same value
    limits = merged(default, LimitsOverride(max_tools=3, max_tokens=500_000))
    assert (limits.max_tools, limits.max_tokens) == (3, 500_000)  # lower and higher
    assert limits.max_messages == default.max_messages


def test_a_tier_the_tenant_may_not_use_moves_down_else_up() -> None:
    tiers = ("small", "medium", "large")
    assert clamp_tier(tiers, "large", frozenset({"small", "medium"})) == "medium"
    assert clamp_tier(tiers, "medium", frozenset({"small", "large"})) == "small"
    assert clamp_tier(tiers, "small", frozenset({"large"})) == "large"
    assert clamp_tier(tiers, "small", frozenset({"xl"})) is None
    routes = {"auto": tiers, "plain": ("small",)}
    assert tier_clamps(routes, frozenset({"small"})) == {
        "auto": {"medium": "small", "large": "small"}
    }
