"""A tenant's allowed tiers in the tier choice: a tier it may not use moves to one it may
(reported in the reason), and a cascade escalates only as far as its highest allowed tier."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.fleet.replicas import Fleet, Replica
from gateway.policy import Endpoint, parse_policy
from gateway.policy.tenant_checks import tiers_of
from gateway.policy.tenant_overrides import tier_clamps
from gateway.routing.costs import RouteRequest
from gateway.tiering.chooser import TierChooser
from gateway.tiering.stickiness import MemorySessionTiers

POLICY = parse_policy("""\
version: 1
pools:
  s: {tier: small, served_model: s, replicas: [{url: "http://s.test:1"}]}
  m: {tier: medium, served_model: m, replicas: [{url: "http://m.test:1"}]}
  l: {tier: large, served_model: l, replicas: [{url: "http://l.test:1"}]}
models:
  auto: {tiering: three}
tiering:
  three: {tiers: {small: s, medium: m, large: l}, learned: null}
""")
VERIFIABLE = {
    "model": "auto",
    "messages": [{"role": "user", "content": "n?"}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
}
PLAIN = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}


def chooser() -> TierChooser:
    def no_share(replicas: Sequence[Replica], request: RouteRequest) -> float:
        return 0.0

    def no_scorer(artifact: str | None) -> Any:
        raise AssertionError("no learned router in this policy")

    return TierChooser(
        POLICY,
        Fleet(POLICY),
        memory=MemorySessionTiers(),
        cached_share=no_share,
        load_scorer=no_scorer,
    )


def clamps(*allowed: str) -> Any:
    return tier_clamps({"auto": tiers_of(POLICY, "auto")}, frozenset(allowed))


async def test_the_default_tier_moves_to_the_tenants_most_capable_allowed_tier() -> None:
    route = RouteRequest((), None)
    free = await chooser().choose("auto", Endpoint.chat, PLAIN, route)
    assert free.tier == "large"
    capped = await chooser().choose(
        "auto", Endpoint.chat, PLAIN, route, clamps=clamps("small", "medium")
    )
    assert (capped.tier, capped.pool.name) == ("medium", "m")
    assert capped.reason == "default tier; tier large not allowed for the tenant"


async def test_a_cascade_escalates_only_to_an_allowed_tier() -> None:
    route = RouteRequest((), None)
    up_to_medium = await chooser().choose(
        "auto", Endpoint.chat, VERIFIABLE, route, clamps=clamps("small", "medium")
    )
    assert (up_to_medium.tier, up_to_medium.escalate_to) == ("small", "medium")
    only_large = await chooser().choose(
        "auto", Endpoint.chat, VERIFIABLE, route, clamps=clamps("large")
    )
    assert (only_large.tier, only_large.escalate_to) == ("large", None)
