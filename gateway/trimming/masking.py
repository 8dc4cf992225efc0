"""Masking old, large tool outputs: the first thing trimming gives up, before compaction.

A coding agent's history is mostly tool output (file views, search results, test logs) that
the agent read once and acted on. Anthropic's context editing clears such results past
the last few tool uses; masking them was neutral for agents' success where cutting history
without regard to meaning was not (context-guru #5/#20 against distil #8). Here:

- a tool result is masked when it is at least `min_tokens` long, is not an entity snapshot
  (those travel as verified patches), and at least `keep_last_tool_uses` newer tool
  results follow it; its place keeps a stub naming its artifact handle (the session's
  artifacts endpoint returns it whole), so the call and its result still pair;
- masking happens a chunk at a time: the eligible results, oldest first, are masked up to
  the last multiple of `clear_at_least_tokens` their sizes add up to. A result becomes
  eligible only as newer ones arrive, and always after every older one, so the masked set
  only ever grows, and only when another whole chunk is due: between those moments each
  turn's context extends the previous one byte for byte and the prefix cache keeps
  hitting. Anthropic's `clear_at_least` serves the same end.

Deterministic and stateless: the same conversation gives the same masked set.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence

from gateway.chat.messages import Message
from gateway.policy.sessions import MaskingSpec

STUB = "[tool output elided: {tokens} tokens; artifact {handle}]"


def masked_results(
    messages: Sequence[Message],
    start: int,
    snapshots: Container[int],
    tokens_of: Callable[[Message], int],
    spec: MaskingSpec,
) -> frozenset[int]:
    """The indices of the tool results to mask (history from `start` on)."""
    results = [i for i in range(start, len(messages)) if messages[i].get("role") == "tool"]
    kept = spec.keep_last_tool_uses
    older = results[: len(results) - kept] if kept else results
    eligible = [
        (i, size)
        for i in older
        if i not in snapshots and (size := tokens_of(messages[i])) >= spec.min_tokens
    ]
    total = sum(size for _, size in eligible)
    due = (total // spec.clear_at_least_tokens) * spec.clear_at_least_tokens
    masked: set[int] = set()
    running = 0
    for index, size in eligible:
        running += size
        if running > due:
            break
        masked.add(index)
    return frozenset(masked)
