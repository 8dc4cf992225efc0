"""Choosing the tier of a request to a routable model alias, explainably.

In order: a policy rule; else, for a verifiable request (checks it must pass), the lowest
tier first with a cascade behind it; else the learned router's score against the policy
threshold, held back by the session's current tier (a margin, widened by how much of the
prompt that tier's replicas already cache); else the default tier. Every choice carries
the reason the response reports in `X-Gateway-Route-Reason`.

Only the learned router's (and the default's) choices move a session: a rule or cascade
sends one call elsewhere (a classification inside a planning session) without dragging
the conversation, and its cached prefix, along.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway import headers
from gateway.errors import ContextLengthExceeded
from gateway.fleet.replicas import Fleet, Pool, Replica, UnservedModel
from gateway.policy import Endpoint, Policy
from gateway.policy.tenant_overrides import TierClamps
from gateway.policy.tiering import TieringSpec
from gateway.routing.costs import RouteRequest
from gateway.tiering.checks import OutputChecks, checks_for
from gateway.tiering.outgrown import OutgrownWindows
from gateway.tiering.rules import RequestFacts, Rules, facts_of
from gateway.tiering.shadow import ShadowJob
from gateway.tiering.stickiness import SessionTiers
from gateway.untrusted.schemas import ClientSchema


class Scorer(Protocol):
    def score(self, text: str) -> float:
        """Probability-like: higher when the lowest tier is good enough."""
        ...


def load_learned_router(artifact: str | None) -> Scorer:
    """The learned router from an artifact file, or the shipped one (None)."""
    from gateway.tiering.learned import LearnedRouter  # only policies that use it load it

    return LearnedRouter.load(artifact)


# The share of a request's prefix blocks the best of these replicas already holds.
CachedShare = Callable[[Sequence[Replica], RouteRequest], float]


@dataclass(frozen=True)
class TierChoice:
    pool: Pool
    tier: str
    reason: str
    by: str  # explicit | rule | cascade | router | session | default | escalation
    checks: OutputChecks | None = None
    escalate_to: str | None = None  # the tier a failed check moves to, if any
    fallback: str | None = None  # the fallback model serving, when the asked one could not
    text: str | None = None  # what the tier router reads (the last user message); None: untiered
    shadow: ShadowJob | None = None  # a candidate router's decision, made after the answer

    def header_values(self) -> dict[str, str]:
        values = {headers.TIER: self.tier, headers.ROUTE_REASON: self.reason}
        if self.fallback is not None:
            values[headers.FALLBACK] = self.fallback
        return values


class _Route:
    """One `tiering` entry, built into runtime objects once."""

    def __init__(
        self,
        name: str,
        spec: TieringSpec,
        fleet: Fleet,
        scorer: Scorer | None,
        shadow: Scorer | None = None,
    ) -> None:
        self.name = name
        self.spec = spec
        self.pools = {tier: fleet.pools[pool] for tier, pool in spec.tiers.items()}
        self.rules = Rules(spec.rules)
        self.scorer = scorer if spec.learned is not None and spec.learned.enabled else None
        self.shadow = shadow  # a candidate router, scored after the answer (shadow.py)

    def shadow_job(self, text: str) -> ShadowJob | None:
        """What the candidate needs, taken now and scored later: no scoring here."""
        learned = self.spec.learned
        if self.shadow is None or learned is None or learned.shadow is None:
            return None
        if learned.shadow.sample_ratio < 1.0 and random.random() >= learned.shadow.sample_ratio:
            return None
        return ShadowJob(
            text,
            self.shadow,
            learned.shadow.threshold,
            self.scorer,
            learned.threshold,
            self.spec.lowest,
            self.spec.highest,
        )


class TierChooser:
    def __init__(
        self,
        policy: Policy,
        fleet: Fleet,
        *,
        memory: SessionTiers,
        cached_share: CachedShare,
        load_scorer: Callable[[str | None], Scorer],
    ) -> None:
        self._fleet = fleet
        self._memory = memory
        # Conversations a tier's window refused, sent on past it (gateway/tiering/outgrown.py).
        self._outgrown = OutgrownWindows()
        self._cached_share = cached_share
        scorers: dict[str | None, Scorer] = {}

        def loaded(artifact: str | None) -> Scorer:
            if artifact not in scorers:  # one artifact loaded once, however many routes
                scorers[artifact] = load_scorer(artifact)
            return scorers[artifact]

        def scorer_for(spec: TieringSpec) -> Scorer | None:
            if spec.learned is None or not spec.learned.enabled:
                return None
            return loaded(spec.learned.artifact)

        def shadow_for(spec: TieringSpec) -> Scorer | None:
            if spec.learned is None or spec.learned.shadow is None:
                return None
            return loaded(spec.learned.shadow.artifact)

        routes = {
            name: _Route(name, spec, fleet, scorer_for(spec), shadow_for(spec))
            for name, spec in policy.tiering.items()
        }
        self._routes = {
            alias: routes[model.tiering]
            for alias, model in policy.models.items()
            if model.tiering is not None
        }

    def check_model(self, alias: str, endpoint: Endpoint) -> None:
        """Fail fast, before any state is touched, on a model that cannot serve this."""
        route = self._routes.get(alias)
        if route is None:
            self._fleet.pool_for(alias, endpoint)
        else:
            self._check_serves(alias, route, endpoint)

    async def choose(
        self,
        alias: str,
        endpoint: Endpoint,
        body: dict[str, Any],
        route_request: RouteRequest,
        *,
        task: str | None = None,
        clamps: TierClamps | None = None,
        response_schema: ClientSchema | None = None,
    ) -> TierChoice:
        """`clamps`: the tiers the caller's tenant may not use, per routable alias, and
        where such a choice goes instead (gateway/policy/tenant_overrides.py).
        `response_schema`: the body's `json_schema` response format, prepared when the
        request was parsed (gateway/chat/inbound.py); prepared again when not given."""
        route = self._routes.get(alias)
        if route is None:
            pool = self._fleet.pool_for(alias, endpoint)
            return TierChoice(pool, pool.spec.tier, "explicit model", "explicit")
        spec = route.spec
        checks = None
        if endpoint is Endpoint.chat:
            checks = checks_for(spec.guardrails, body, response_schema)
        facts = facts_of(body, task_header=task, small_object_fields=spec.small_object_fields)
        tier, reason, by = await self._tier(route, facts, route_request, checks)
        highest = spec.highest
        clamp = clamps.get(alias) if clamps else None
        if clamp is not None:
            highest = clamp.get(highest, highest)
            if tier in clamp:
                tier, reason = clamp[tier], f"{reason}; tier {tier} not allowed for the tenant"
        cascade = spec.cascade
        escalate_to = None
        # What may fail and move up: an answer's checks, or its tool calls (gateway/toolcalls/).
        may_fail = checks is not None or (endpoint is Endpoint.chat and bool(body.get("tools")))
        if may_fail and cascade.on_fail == "escalate" and tier != highest:
            escalate_to = highest
        return TierChoice(
            route.pools[tier],
            tier,
            reason,
            by,
            checks=checks,
            escalate_to=escalate_to,
            text=facts.last_user,
            shadow=route.shadow_job(facts.last_user),
        )

    def escalated(self, alias: str, choice: TierChoice, failed: str) -> TierChoice:
        """The same request on the tier a failed check moves it to."""
        assert choice.escalate_to is not None
        tier = choice.escalate_to
        reason = f"cascade: {choice.tier} failed {failed}, escalated to {tier}"
        return self._moved(alias, choice, tier, reason, "escalation")

    def wider(
        self, alias: str, choice: TierChoice, window: int, clamps: TierClamps | None = None
    ) -> TierChoice | None:
        """The same request on the tier with the smallest window larger than `window`, the
        one its prompt did not fit, among those the tenant may use; None for an alias
        without tiers, or when no other tier's window is known to be larger."""
        found = self._wider_tier(alias, choice, window, clamps)
        if found is None:
            return None
        tier, tokens = found
        reason = f"window: {choice.tier} holds {window} tokens, not the prompt; {tier} {tokens}"
        return self._moved(alias, choice, tier, reason, "escalation")

    def outgrew(
        self, alias: str, route_request: RouteRequest, refusal: ContextLengthExceeded, size: int
    ) -> None:
        """A request of `size` bytes did not fit a tier's window: the conversation's later
        requests estimated as large skip tiers that small (`past_outgrown`)."""
        if alias not in self._routes:  # an untiered model has nowhere else to go
            return
        self._outgrown.refused(route_request.session_hash, alias, refusal.needed, size)

    def past_outgrown(
        self,
        alias: str,
        choice: TierChoice,
        route_request: RouteRequest,
        size: Callable[[], int],
        clamps: TierClamps | None = None,
    ) -> TierChoice | None:
        """The tier a request goes to instead of `choice` when an earlier request of its
        conversation did not fit a window and this one, estimated from that refusal's
        tokens per byte, needs more than `choice`'s window too; None: `choice` stands.
        `size`: the request's size in bytes, asked for only then."""
        if not len(self._outgrown):  # nothing ever refused: no hash, no lookup
            return None
        needed = self._outgrown.needed(route_request.session_hash, alias, size)
        if needed is None:
            return None
        window = choice.pool.context_tokens()
        if window is None or window > needed:
            return None
        found = self._wider_tier(alias, choice, needed, clamps)
        if found is None:
            return None
        tier, larger = found
        reason = (
            f"session: about {needed} tokens, past {choice.tier}'s {window} (an earlier "
            f"turn did not fit); {tier} {larger}"
        )
        return self._moved(alias, choice, tier, reason, "session")

    def _moved(self, alias: str, choice: TierChoice, tier: str, reason: str, by: str) -> TierChoice:
        """The same request (its checks, its text) on another of the alias's tiers."""
        pool = self._routes[alias].pools[tier]
        return TierChoice(pool, tier, reason, by, checks=choice.checks, text=choice.text)

    def _wider_tier(
        self, alias: str, choice: TierChoice, window: int, clamps: TierClamps | None
    ) -> tuple[str, int] | None:
        """The tenant's tier, other than `choice`'s, with the smallest window above
        `window` tokens, and that window."""
        route = self._routes.get(alias)
        if route is None:
            return None
        barred = clamps.get(alias, {}) if clamps else {}
        larger = [
            (tokens, tier)
            for tier, pool in route.pools.items()
            if tier != choice.tier and tier not in barred
            and (tokens := pool.context_tokens()) is not None and tokens > window
        ]  # fmt: skip
        if not larger:
            return None
        tokens, tier = min(larger)
        return tier, tokens

    def structured_outputs(self, alias: str) -> bool:
        route = self._routes.get(alias)
        return route is not None and route.spec.cascade.structured_outputs

    async def _tier(
        self,
        route: _Route,
        facts: RequestFacts,
        route_request: RouteRequest,
        checks: OutputChecks | None,
    ) -> tuple[str, str, str]:
        spec = route.spec
        rule = route.rules.first_match(facts)
        if rule is not None:
            return rule.tier, f"rule:{rule.name}", "rule"
        if checks is not None and spec.cascade.enabled and len(spec.tiers) > 1:
            return spec.lowest, f"cascade: verifiable ({', '.join(checks.names)})", "cascade"
        session, tenant = route_request.session, route_request.tenant
        if route.scorer is None or spec.learned is None:
            tier = spec.default_tier or spec.highest
            if session is not None:
                ttl_s = spec.stickiness.ttl_s
                await self._memory.put(route.name, session, tier, ttl_s, tenant=tenant)
            return tier, "default tier", "default"
        threshold = spec.learned.threshold
        score = route.scorer.score(facts.last_user)
        wanted = spec.lowest if score >= threshold else spec.highest
        sign = ">=" if score >= threshold else "<"
        reason = f"router: score {score:.3f} {sign} threshold {threshold:.3f}"
        if session is None:
            return wanted, reason, "router"
        ttl_s = spec.stickiness.ttl_s
        current = await self._memory.get(route.name, session, tenant=tenant)
        if current is not None and current != wanted and current in route.pools:
            margin = self._switch_margin(route, current, route_request)
            needed = threshold + margin if wanted == spec.lowest else threshold - margin
            leaves = score >= needed if wanted == spec.lowest else score < needed
            if not leaves:
                sign = ">=" if wanted == spec.lowest else "<"
                reason = (
                    f"session: stays on {current} (score {score:.3f}; moving to {wanted} "
                    f"needs {sign} {needed:.3f})"
                )
                # refreshes its TTL
                await self._memory.put(route.name, session, current, ttl_s, tenant=tenant)
                return current, reason, "session"
        await self._memory.put(route.name, session, wanted, ttl_s, tenant=tenant)
        return wanted, reason, "router"

    def _switch_margin(self, route: _Route, current: str, route_request: RouteRequest) -> float:
        stickiness = route.spec.stickiness
        share = 0.0
        if stickiness.cache_weight and route_request.blocks:
            share = self._cached_share(route.pools[current].replicas, route_request)
        return stickiness.margin + stickiness.cache_weight * share

    def _check_serves(self, alias: str, route: _Route, endpoint: Endpoint) -> None:
        if not all(pool.serves(endpoint) for pool in route.pools.values()):
            raise UnservedModel(
                f"The model `{alias}` does not serve this endpoint: its tiers' pools "
                f"({', '.join(p.name for p in route.pools.values())}) do not."
            )
