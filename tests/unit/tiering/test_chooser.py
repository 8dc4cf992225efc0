"""Tier choice: explicit models, rules first, verifiable requests cascade, the learned score
against the threshold, and sessions that do not bounce between tiers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gateway.errors import ModelNotFound
from gateway.fleet.replicas import Fleet, Replica
from gateway.policy import Endpoint, Policy, parse_policy
from gateway.routing.costs import RouteRequest
from gateway.tiering.chooser import TierChooser
from gateway.tiering.stickiness import MemorySessionTiers

POLICY = """\
version: 1
pools:
  s: {tier: small, served_model: s, replicas: [{url: "http://s.test:1"}]}
  l: {tier: large, served_model: l, replicas: [{url: "http://l.test:1"}]}
  e: {served_model: e, serves: [embeddings], replicas: [{url: "http://e.test:1"}]}
models:
  small: {pool: s}
  embed: {pool: e}
  auto: {tiering: default}
tiering:
  default:
    tiers: {small: s, large: l}
    rules:
      - {name: classify, when: {task: [classify]}, then: small}
      - {name: plan, when: {last_user_matches: "(?i)^plan"}, then: large}
    learned: {threshold: 0.5}
    stickiness: {margin: 0.1, cache_weight: 0.2}
"""


class FixedScore:
    def __init__(self) -> None:
        self.value = 0.9
        self.texts: list[str] = []

    def score(self, text: str) -> float:
        self.texts.append(text)
        return self.value


class Setup:
    def __init__(self, policy_text: str = POLICY) -> None:
        self.policy: Policy = parse_policy(policy_text)
        self.scorer = FixedScore()
        self.memory = MemorySessionTiers()
        self.share = 0.0
        self.loaded: list[str | None] = []

        def cached_share(replicas: Sequence[Replica], request: RouteRequest) -> float:
            return self.share

        def load(artifact: str | None) -> FixedScore:
            self.loaded.append(artifact)
            return self.scorer

        self.chooser = TierChooser(
            self.policy, Fleet(self.policy), memory=self.memory, cached_share=cached_share,
            load_scorer=load,
        )  # fmt: skip

    async def choose(
        self, text: str = "hello", *, model: str = "auto", session: str | None = None, **extra: Any
    ) -> tuple[str, str, str]:
        body = {"model": model, "messages": [{"role": "user", "content": text}], **extra}
        route = RouteRequest((1, 2, 3, 4), session)
        choice = await self.chooser.choose(
            model, Endpoint.chat, body, route, task=extra.pop("task", None)
        )
        return choice.tier, choice.by, choice.reason


@pytest.fixture
def setup() -> Setup:
    return Setup()


async def test_an_explicit_model_is_honoured(setup: Setup) -> None:
    assert await setup.choose(model="small") == ("small", "explicit", "explicit model")
    assert setup.scorer.texts == []


async def test_unknown_and_unserved_models_are_404(setup: Setup) -> None:
    with pytest.raises(ModelNotFound, match="Available models: auto, embed, small"):
        setup.chooser.check_model("nope", Endpoint.chat)
    with pytest.raises(ModelNotFound, match="does not serve"):
        setup.chooser.check_model("auto", Endpoint.embeddings)


async def test_rules_decide_before_the_router(setup: Setup) -> None:
    setup.scorer.value = 0.99
    assert await setup.choose("Plan a trip") == ("large", "rule", "rule:plan")
    body = {"model": "auto", "messages": [{"role": "user", "content": "x"}]}
    choice = await setup.chooser.choose(
        "auto", Endpoint.chat, body, RouteRequest((), None), task="classify"
    )
    assert (choice.tier, choice.reason) == ("small", "rule:classify")
    assert setup.scorer.texts == []


async def test_the_router_score_against_the_threshold(setup: Setup) -> None:
    setup.scorer.value = 0.7
    assert await setup.choose("easy one") == (
        "small",
        "router",
        "router: score 0.700 >= threshold 0.500",
    )
    setup.scorer.value = 0.2
    assert await setup.choose("hard one") == (
        "large",
        "router",
        "router: score 0.200 < threshold 0.500",
    )
    assert setup.scorer.texts == ["easy one", "hard one"]
    assert setup.loaded == [None]  # the shipped artifact, loaded once


async def test_a_verifiable_request_starts_on_the_lowest_tier(setup: Setup) -> None:
    setup.scorer.value = 0.0
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}
    body = {
        "model": "auto",
        "messages": [{"role": "user", "content": "n?"}],
        "response_format": fmt,
    }
    choice = await setup.chooser.choose("auto", Endpoint.chat, body, RouteRequest((), None))
    assert (choice.tier, choice.by, choice.escalate_to) == ("small", "cascade", "large")
    assert choice.reason == "cascade: verifiable (response_format)"
    up = setup.chooser.escalated("auto", choice, "response_format")
    assert (up.tier, up.by, up.escalate_to) == ("large", "escalation", None)
    assert up.reason == "cascade: small failed response_format, escalated to large"


async def test_a_session_keeps_its_tier_within_the_margin(setup: Setup) -> None:
    setup.scorer.value = 0.3
    assert (await setup.choose(session="s1"))[:2] == ("large", "router")
    setup.scorer.value = 0.55  # past the threshold, not past threshold + margin
    tier, by, reason = await setup.choose(session="s1")
    assert (tier, by) == ("large", "session")
    assert reason == "session: stays on large (score 0.550; moving to small needs >= 0.600)"
    setup.scorer.value = 0.65  # past the margin: the session moves
    assert (await setup.choose(session="s1"))[:2] == ("small", "router")
    setup.scorer.value = 0.45
    assert (await setup.choose(session="s1"))[:2] == ("small", "session")
    setup.scorer.value = 0.35
    assert (await setup.choose(session="s1"))[:2] == ("large", "router")
    # Without a session every request is decided on its own.
    setup.scorer.value = 0.55
    assert (await setup.choose())[:2] == ("small", "router")


async def test_a_cached_prefix_widens_the_margin(setup: Setup) -> None:
    setup.scorer.value = 0.3
    await setup.choose(session="s2")
    setup.share = 1.0  # the whole prompt is cached on the large tier's replicas
    setup.scorer.value = 0.75
    tier, by, reason = await setup.choose(session="s2")
    assert (tier, by) == ("large", "session")
    assert "needs >= 0.800" in reason
    setup.scorer.value = 0.85
    assert (await setup.choose(session="s2"))[:2] == ("small", "router")


async def test_rules_do_not_move_the_session(setup: Setup) -> None:
    setup.scorer.value = 0.3
    await setup.choose(session="s3")
    assert (await setup.choose(session="s3", task="classify"))[:2] == ("small", "rule")
    assert setup.memory.tiers == {"default:s3": "large"}


async def test_without_a_learned_router_the_default_tier_serves() -> None:
    setup = Setup(
        POLICY.replace("learned: {threshold: 0.5}", "learned: null\n    default_tier: small")
    )
    assert await setup.choose() == ("small", "default", "default tier")
    assert setup.loaded == []
