"""What each request cost and saved, from its counted tokens and the policy's prices.

Money is counted in integer nano-dollars (a price in dollars per million tokens times a
token count is a whole number of nano-dollars for prices with up to three decimals), so
sums over millions of requests stay exact:
- cost: uncached prompt tokens at the input price, cached ones at the cached-input price,
  completion tokens at the output price, all of the pool that answered;
- saved by the cache: cached prompt tokens times (input price - cached-input price);
- saved by trimming: the tokens trimming removed from the context, at the input price;
- saved by the small tier: what the same tokens would have cost on the model alias's
  dearest tier, less what they cost on the tier that answered.

Read by telemetry (metrics and the usage ledger, gateway/telemetry/usage.py) and by
budgets (gateway/quota/).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields

from gateway.policy import Policy
from gateway.policy.telemetry import PriceSpec
from gateway.telemetry.record import RequestRecord, ResultFacts

NANO = 1_000_000_000  # nano-dollars per dollar


@dataclass(frozen=True, slots=True)
class Spend:
    """One request's tokens, cost and savings."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    trimmed_tokens: int = 0
    small_tier_tokens: int = 0
    cost_nusd: int = 0
    saved_cache_nusd: int = 0
    saved_trimming_nusd: int = 0
    saved_small_tier_nusd: int = 0

    def counts(self, error: bool) -> dict[str, int]:
        """The request as ledger counters (one per request: built once per call)."""
        out = {name: getattr(self, name) for name in _SPEND_FIELDS}
        out["requests"] = 1
        out["errors"] = int(error)
        return out


_SPEND_FIELDS = tuple(f.name for f in fields(Spend))


def _nusd(tokens: int, per_million: float) -> int:
    return round(tokens * per_million * 1000)


class Prices:
    """Prices by pool, and for each routable model alias the price of its dearest tier
    (what small-tier routing is measured against)."""

    def __init__(self, policy: Policy) -> None:
        self.by_pool: dict[str, PriceSpec] = {
            name: pool.price for name, pool in policy.pools.items() if pool.price is not None
        }
        self.reference: dict[str, PriceSpec] = {}
        for alias, model in policy.models.items():
            if model.tiering is None:
                continue
            priced = [
                self.by_pool[pool]
                for pool in policy.tiering[model.tiering].tiers.values()
                if pool in self.by_pool
            ]
            if priced:
                self.reference[alias] = max(priced, key=lambda p: (p.input + p.output, p.output))

    def spend(self, record: RequestRecord) -> Spend:
        """The request's spend: its answer's, plus any answer that failed its checks and
        was escalated (paid for, saving nothing)."""
        total = self._answer(record.model, record.pool, record.result, record.trimmed_tokens)
        for pool, result in record.earlier:
            wasted = self._answer(None, pool, result, 0)
            total = Spend(*(a + b for a, b in zip(astuple(total), astuple(wasted), strict=True)))
        return total

    def _answer(
        self, model: str | None, pool: str | None, result: ResultFacts, trimmed: int
    ) -> Spend:
        prompt = result.prompt_tokens or 0
        cached = min(result.cached_tokens or 0, prompt)
        completion = result.completion_tokens or 0
        price = self.by_pool.get(pool or "")
        if price is None:
            return Spend(prompt, cached, completion, trimmed)
        cost = (
            _nusd(prompt - cached, price.input)
            + _nusd(cached, price.cached)
            + _nusd(completion, price.output)
        )
        reference = self.reference.get(model or "")
        saved_tier, tier_tokens = 0, 0
        if reference is not None and reference is not price:
            at_reference = (
                _nusd(prompt - cached, reference.input)
                + _nusd(cached, reference.cached)
                + _nusd(completion, reference.output)
            )
            saved_tier = max(0, at_reference - cost)
            tier_tokens = prompt + completion if saved_tier else 0
        return Spend(
            input_tokens=prompt,
            cached_input_tokens=cached,
            output_tokens=completion,
            trimmed_tokens=trimmed,
            small_tier_tokens=tier_tokens,
            cost_nusd=cost,
            saved_cache_nusd=_nusd(cached, price.input - price.cached),
            saved_trimming_nusd=_nusd(trimmed, price.input),
            saved_small_tier_nusd=saved_tier,
        )
