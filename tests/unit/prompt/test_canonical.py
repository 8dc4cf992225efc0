"""Canonicalization golden tests: same meaning, same bytes; different meaning, different
bytes. Tool schemas come from the real tau-bench airline domain."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from gateway.policy.canonicalize import CanonicalizeSpec, VolatilePattern, VolatileSpec
from gateway.prompt.blocks import request_blocks
from gateway.prompt.canonical import Canonicalizer, fingerprint
from tests.conftest import SHARED_DATA
from tests.unit.deadline import deadline

TOOLS: list[dict[str, Any]] = json.loads(
    (SHARED_DATA / "agent-trajectories" / "tau_bench_airline_tools.json").read_text()
)
DEFAULT = Canonicalizer(CanonicalizeSpec())


def body(tools: list[dict[str, Any]], system: str = "You are an airline agent.") -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
        "tools": tools,
    }


def canonical_bytes(b: dict[str, Any]) -> bytes:
    return orjson.dumps(DEFAULT.apply(b).body or b)


def shuffled_keys(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffled_keys(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [shuffled_keys(v, rng) for v in value]
    return value


def test_reordered_tools_and_schema_keys_give_identical_bytes() -> None:
    reference = canonical_bytes(body(TOOLS))
    for seed in range(5):
        rng = random.Random(seed)
        tools = shuffled_keys(TOOLS, rng)
        rng.shuffle(tools)
        assert canonical_bytes(body(tools)) == reference


def test_canonical_tools_are_sorted_by_name_with_sorted_keys() -> None:
    out = DEFAULT.apply(body(list(reversed(TOOLS)))).body
    assert out is not None
    names = [t["function"]["name"] for t in out["tools"]]
    assert names == sorted(names)
    first = out["tools"][0]
    assert list(first) == sorted(first)
    assert list(first["function"]) == sorted(first["function"])


def test_already_canonical_request_is_left_alone() -> None:
    once = DEFAULT.apply(body(TOOLS)).body
    assert once is not None
    again = DEFAULT.apply(once)
    assert again.body is None
    assert again.tools_json == orjson.dumps(once["tools"])  # reused for prefix hashing
    plain = DEFAULT.apply({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert plain.body is None
    assert plain.tools_json is None


def test_different_meaning_gives_different_bytes() -> None:
    changed = json.loads(json.dumps(TOOLS))
    changed[0]["function"]["description"] += " (v2)"
    assert canonical_bytes(body(changed)) != canonical_bytes(body(TOOLS))
    assert canonical_bytes(body(TOOLS[1:])) != canonical_bytes(body(TOOLS))
    assert canonical_bytes(body(TOOLS, system="Other rules.")) != canonical_bytes(body(TOOLS))


def test_canonical_prefix_blocks_survive_tool_shuffling() -> None:
    rng = random.Random(7)
    shuffled = list(TOOLS)
    rng.shuffle(shuffled)
    raw_a, raw_b = request_blocks(body(TOOLS), 512), request_blocks(body(shuffled), 512)
    assert raw_a != raw_b  # without canonicalization the cacheable prefix breaks
    canon_a = request_blocks(DEFAULT.apply(body(TOOLS)).body or {}, 512)
    canon_b = request_blocks(DEFAULT.apply(body(shuffled)).body or {}, 512)
    assert canon_a == canon_b


def test_sorting_can_be_turned_off() -> None:
    off = Canonicalizer(CanonicalizeSpec(sort_tools=False, sort_schema_keys=False))
    out = off.apply(body(list(reversed(TOOLS))))
    assert out.body is None
    assert out.tools_json == orjson.dumps(list(reversed(TOOLS)))


VOLATILE = CanonicalizeSpec(
    volatile=VolatileSpec(
        patterns=(
            VolatilePattern(name="date"),
            VolatilePattern(name="time"),
            VolatilePattern(name="ticket", regex=r"TCK-\d+"),
        )
    )
)


def test_volatile_values_move_after_the_conversation() -> None:
    canon = Canonicalizer(VOLATILE)
    day1 = body([], system="Today is 2026-11-29, 14:05 UTC. Ticket TCK-881. Be kind.")
    day2 = body([], system="Today is 2026-11-30, 09:12 UTC. Ticket TCK-882. Be kind.")
    out1, out2 = canon.apply(day1).body, canon.apply(day2).body
    assert out1 is not None and out2 is not None
    # The stable system prompt is byte-identical; the values follow at the end.
    assert out1["messages"][0] == out2["messages"][0]
    assert out1["messages"][0]["content"] == "Today is [date], [time]. Ticket [ticket]. Be kind."
    assert out1["messages"][-1] == {
        "role": "system",
        "content": "Current values: date=2026-11-29; time=14:05 UTC; ticket=TCK-881",
    }
    assert out1["messages"][1] == day1["messages"][1]


def test_volatile_note_can_go_into_the_last_user_message() -> None:
    spec = CanonicalizeSpec(
        volatile=VolatileSpec(patterns=(VolatilePattern(name="uuid"),), placement="last_user")
    )
    out = (
        Canonicalizer(spec).apply(body([], system="Run 123e4567-e89b-12d3-a456-426614174000.")).body
    )
    assert out is not None
    assert out["messages"][0]["content"] == "Run [uuid]."
    assert out["messages"][-1] == {
        "role": "user",
        "content": "hi\n\nCurrent values: uuid=123e4567-e89b-12d3-a456-426614174000",
    }


def test_volatile_is_off_by_default() -> None:
    assert DEFAULT.apply(body([], system="Today is 2026-11-29.")).body is None


def test_unknown_preset_or_bad_regex_is_rejected() -> None:
    with pytest.raises(ValueError, match="no preset named"):
        VolatilePattern(name="weekday")
    with pytest.raises(ValueError, match="not a valid regex"):
        VolatilePattern(name="x", regex="(")


def test_fingerprint_tells_which_part_changed() -> None:
    base = fingerprint(body(TOOLS))
    assert fingerprint(body(TOOLS)).changes_from(base) == []
    assert fingerprint(body(TOOLS[1:])).changes_from(base) == ["tools"]
    assert fingerprint(body(TOOLS, system="New rules")).changes_from(base) == ["system"]
    assert fingerprint(body(TOOLS[1:], system="New")).changes_from(base) == ["system", "tools"]


def test_a_backtracking_volatile_pattern_cuts_a_prompt_in_linear_time() -> None:
    """The patterns run on every client's system prompt: with RE2, `(a+)+b` over 10,000
    `a`s takes linear time (Python's `re` would never finish)."""
    spec = CanonicalizeSpec(
        volatile=VolatileSpec(patterns=(VolatilePattern(name="evil", regex="(a+)+b"),))
    )
    prompt = "a" * 10_000 + "c, then aab."
    with deadline():
        out = Canonicalizer(spec).apply(body([], system=prompt)).body
    assert out is not None
    assert out["messages"][0]["content"] == "a" * 10_000 + "c, then [evil]."
