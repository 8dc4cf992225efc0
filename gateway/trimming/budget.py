"""The marks one conversation is trimmed to: the policy's fixed watermarks, or, when
`trimming.budget` is set, marks that follow the engine's context and the conversation.

Fixed watermarks count the whole history, the compacted block included. In a long agent
run the block (a line per folded tool call) grows until it fills the low-water mark by
itself: from then on every turn compacts, and the tail keeps nothing of what the agent
just read. A coding agent whose file views run to thousands of tokens gets there at once
under watermarks sized for an airline agent's short lookups; and a session can outgrow a
small engine's context (vLLM then refuses the request) under watermarks sized for a large
one. With a budget:

- the **tail** (the turns after the block, kept verbatim) is what the marks measure: a
  compaction keeps a tail of at most `low` tokens, where `low` grows to hold
  `tool_outputs_kept` of the conversation's median tool output (its own sizes, not a guess
  made for every agent); the block, append-only and cached, does not eat into it;
- a compaction happens when the tail passes `low` by `gap` (the policy's high - low, or
  `clear_at_least_tokens`, whichever is larger) and must free at least
  `clear_at_least_tokens`, since it changes the context from the block on (Anthropic's
  context editing asks the same with `clear_at_least`);
- the engine's context caps the whole history at `context_share` of `context_tokens`
  (when the budget sets none, the smallest context window the route's engines report:
  vLLM's `max_model_len`, read by gateway/fleet/health.py) less the system prompt; past
  the cap a compaction happens whatever else the marks say, and keeps a history under the
  cap less the gap.

Deterministic: the same conversation and policy give the same marks. The median moves as
tool outputs arrive, so the marks do too, but they only matter when compaction is
considered: between compactions the context still extends the previous one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.policy.sessions import TrimmingSpec


@dataclass(frozen=True)
class Marks:
    """`relative` False: `high` and `low` bound the whole history (the fixed watermarks).
    True: they bound the tail after the block, and `cap` the whole history."""

    high: int
    low: int
    relative: bool = False
    cap: int | None = None  # history tokens the engine's context allows
    clear_at_least: int = 0  # a compaction that frees less waits (unless over the cap)

    def triggered(self, history: int, tail: int) -> bool:
        return self.over_cap(history) or (tail if self.relative else history) > self.high

    def fits(self, history: int, tail: int) -> bool:
        """Whether a cut leaving this history (and tail after the block) is far enough."""
        if not self.relative:
            return history <= self.low
        under_cap = self.cap is None or history <= self.cap - (self.high - self.low)
        return tail <= self.low and under_cap

    def worth(self, freed: int, history: int) -> bool:
        """Whether a compaction freeing `freed` of `history` tokens is made (the fixed
        watermarks make every one, as they always have)."""
        return not self.relative or freed >= self.clear_at_least or self.over_cap(history)

    def over_cap(self, history: int) -> bool:
        return self.cap is not None and history > self.cap


def marks(
    spec: TrimmingSpec,
    system_tokens: int,
    tool_outputs: Sequence[int],
    engine_context: int | None = None,
) -> Marks:
    """`system_tokens`: the system prompt's tokens (the history's neighbour in the
    context); `tool_outputs`: the token counts of the conversation's tool results;
    `engine_context`: the context window the engines report (vLLM's `/v1/models`), used
    when the budget sets none."""
    budget = spec.budget
    if budget is None:
        return Marks(spec.high_water_tokens, spec.low_water_tokens)
    low = spec.low_water_tokens
    if budget.tool_outputs_kept and tool_outputs:
        low = max(low, budget.tool_outputs_kept * _median(tool_outputs))
    gap = max(spec.high_water_tokens - spec.low_water_tokens, budget.clear_at_least_tokens)
    cap = None
    context = budget.context_tokens or engine_context
    if context is not None:
        # At least one token of history, so a system prompt larger than the share still
        # leaves the trimmer a target (the smallest history it can make).
        cap = max(1, int(budget.context_share * context) - system_tokens)
        gap = min(gap, cap // 2)  # a gap wider than half the cap would leave no target
        low = min(low, cap - gap)
    return Marks(low + gap, low, True, cap, budget.clear_at_least_tokens)


def _median(values: Sequence[int]) -> int:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
