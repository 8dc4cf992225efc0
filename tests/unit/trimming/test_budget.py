"""Budgets relative to the engine and the conversation: the engine's context caps the
history, the kept tail grows with the conversation's own tool outputs, and a compaction
frees at least a chunk worth the cache it invalidates."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.policy.sessions import BudgetSpec, TrimmingSpec
from gateway.responses.compaction import compact
from gateway.trimming.budget import marks
from gateway.trimming.conversation import problems
from gateway.trimming.tokens import ByteEstimate
from gateway.trimming.trim import Trimmer
from tests.unit.trimming.test_masking import coding_conversation
from tests.unit.trimming.test_trim import SPEC, requests

FIXED = SPEC  # 400 / 120


def budgeted(**budget: Any) -> TrimmingSpec:
    return SPEC.model_copy(update={"budget": BudgetSpec(**budget)})


def replay(spec: TrimmingSpec, conversation: list[dict[str, Any]]) -> list[Any]:
    """Each request of the conversation trimmed as a session would: the boundary carried."""
    trimmer = Trimmer(spec, ByteEstimate())
    boundary, outs = 0, []
    for request in requests(conversation):
        if request[-1]["role"] not in ("user", "tool"):
            continue  # not a request an agent sends
        out = trimmer.trim(request, boundary)
        assert not out.fell_back and problems(out.messages) == []
        boundary = out.boundary
        outs.append((request, out))
    return outs


def test_without_a_budget_the_watermarks_are_the_policys() -> None:
    assert marks(FIXED, 500, [10_000]) == marks(FIXED, 0, ())
    assert (marks(FIXED, 0, ()).high, marks(FIXED, 0, ()).low) == (400, 120)


def test_the_low_water_mark_holds_the_conversations_typical_outputs() -> None:
    spec = budgeted(tool_outputs_kept=2, clear_at_least_tokens=300)
    got = marks(spec, 50, [100, 900, 1_000, 1_100])  # median 1,000
    assert got.low == 2_000 and got.high == 2_300 and got.cap is None
    small = marks(spec, 50, [10, 20, 30])  # small outputs: the policy's marks hold
    assert small.low == 120 and small.high == 420


def test_the_engines_context_caps_both_marks() -> None:
    spec = budgeted(context_tokens=4_096, context_share=0.5, tool_outputs_kept=3,
                    clear_at_least_tokens=200)  # fmt: skip
    got = marks(spec, 48, [5_000])
    assert got.cap == 2_048 - 48
    assert got.high == got.cap and got.low <= got.cap - 200
    loose = SPEC.model_copy(update={"high_water_tokens": 8_000, "low_water_tokens": 4_000,
                                    "budget": BudgetSpec(context_tokens=4_096)})  # fmt: skip
    scaled = marks(loose, 0, [])
    assert (scaled.high, scaled.low) == (2_048, 1_024)  # scaled alike: half is still freed
    tiny = marks(spec.model_copy(update={"budget": BudgetSpec(context_tokens=256)}), 500, [])
    assert tiny.cap == 1 and tiny.high == 1 and tiny.low == 1  # a target, however small


def test_a_budget_without_a_context_takes_the_engines() -> None:
    spec = budgeted(context_share=0.5)
    assert marks(spec, 48, [], engine_context=4_096).cap == 2_048 - 48
    assert marks(spec, 48, []).cap is None  # no engine has said yet: no cap
    told = budgeted(context_tokens=8_192, context_share=0.5)
    assert marks(told, 48, [], engine_context=4_096).cap == 4_096 - 48  # the policy wins
    assert Trimmer(spec, ByteEstimate()).follows_engine
    assert not Trimmer(told, ByteEstimate()).follows_engine
    assert not Trimmer(FIXED, ByteEstimate()).follows_engine


def test_a_session_never_outgrows_the_engines_context() -> None:
    # 40-line file views (about 300 tokens each): fixed marks far above what the engine holds
    loose = SPEC.model_copy(update={"high_water_tokens": 50_000, "low_water_tokens": 40_000})
    capped = loose.model_copy(update={"budget": BudgetSpec(context_tokens=4_096)})
    conversation = coding_conversation(30)
    counter = Trimmer(loose, ByteEstimate())
    uncapped_peak = max(counter.history_tokens(r) for r in requests(conversation))
    assert uncapped_peak > 2_048  # without the cap the history outgrows the engine
    outs = [out for _request, out in replay(capped, conversation)]
    for out in outs:
        assert out.history_tokens <= 2_048 - 8  # share of the context less the system prompt
    assert any(out.capped for out in outs)  # the cap compacted, not the loose watermarks
    assert not any(out.capped for _request, out in replay(FIXED, conversation))


def test_a_compaction_frees_a_chunk_and_between_chunks_the_context_extends() -> None:
    spec = budgeted(clear_at_least_tokens=600)
    previous: list[dict[str, Any]] | None = None
    boundary = 0
    compactions = 0
    counter = Trimmer(spec, ByteEstimate())
    for request, out in replay(spec, coding_conversation(20)):
        if out.boundary != boundary:
            compactions += 1
            before = counter.history_tokens(request)
            assert before - out.history_tokens >= 600 or boundary == 0
        elif previous is not None:
            assert out.messages[: len(previous)] == previous  # byte for byte
        previous, boundary = out.messages, out.boundary
    assert compactions >= 2


def test_the_kept_tail_holds_the_latest_outputs_whole() -> None:
    conversation = coding_conversation(20)
    fixed = replay(FIXED, conversation)
    # three typical outputs' worth: the two latest views and what lies between them
    kept = replay(budgeted(tool_outputs_kept=3, clear_at_least_tokens=300), conversation)

    def views(request: list[dict[str, Any]]) -> list[str]:  # snapshots go as patches
        return [m["content"] for m in request if "line 0 of module" in str(m.get("content"))]

    def whole_recent(pairs: list[Any]) -> int:
        count = 0
        for request, out in pairs:
            recent = views(request)[-2:]
            sent = {m.get("content") for m in out.messages if m["role"] == "tool"}
            count += sum(content in sent for content in recent)
        return count

    assert whole_recent(kept) > whole_recent(fixed)
    last_request, last = kept[-1]
    for content in views(last_request)[-2:]:
        assert content in {m.get("content") for m in last.messages}


def test_a_compaction_asked_for_ignores_the_budget() -> None:
    spec = budgeted(tool_outputs_kept=5, clear_at_least_tokens=10_000)
    conversation = coding_conversation(10)
    out = compact(conversation, spec, ByteEstimate())
    assert out.boundary > 0 and out.history_tokens <= 2 * SPEC.low_water_tokens + 400


@pytest.mark.parametrize(
    "budget",
    [{"context_share": 1.0}, {"context_share": 0}, {"context_tokens": 100},
     {"tool_outputs_kept": -1}, {"clear_at_least_tokens": -5}, {"unknown": 1}],
)  # fmt: skip
def test_a_bad_budget_is_refused(budget: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        TrimmingSpec.model_validate({"enabled": True, "budget": budget})
