"""Masking old, large tool outputs: only results old enough and large enough, never entity
snapshots, a whole chunk at a time, so between chunks each context extends the last."""

from __future__ import annotations

from typing import Any

from gateway.policy.sessions import MaskingSpec
from gateway.trimming.conversation import problems
from gateway.trimming.masking import masked_results
from gateway.trimming.tokens import ByteEstimate
from gateway.trimming.trim import Trimmer
from tests.unit.trimming.test_trim import RES_V1, SPEC, SYSTEM, call, requests, result, user

MASKING = MaskingSpec(keep_last_tool_uses=2, min_tokens=50, clear_at_least_tokens=300)
# Compaction out of the way: what happens here is masking's alone.
MASKED = SPEC.model_copy(
    update={"high_water_tokens": 1_000_000, "low_water_tokens": 999_999, "masking": MASKING}
)


def coding_conversation(steps: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [SYSTEM, user("Fix the parser, please.")]
    for step in range(steps):
        messages += [
            call("view", {"path": f"src/module_{step}.py"}, f"c{step}"),
            result("\n".join(f"{n:6}\tline {n} of module {step}" for n in range(40)), f"c{step}"),
        ]
        if step % 3 == 0:
            messages += [call("get_reservation", {"reservation_id": "R1"}, f"s{step}"),
                         result({**RES_V1, "note": f"step {step}"}, f"s{step}")]  # fmt: skip
        messages.append({"role": "assistant", "content": f"Step {step} read."})
    return messages


def test_only_old_large_results_are_masked_and_never_snapshots() -> None:
    trimmer = Trimmer(MASKED, ByteEstimate())
    conversation = [*coding_conversation(8), user("Is it fixed?")]
    out = trimmer.trim(conversation, 0)
    assert problems(out.messages) == []  # each call still has its result
    stubs = [i for i, m in enumerate(out.messages) if "tool output elided" in str(m.get("content"))]
    assert stubs, "some old views are masked"
    tools = [i for i, m in enumerate(conversation) if m["role"] == "tool"]
    assert not set(stubs) & set(tools[-2:])  # the newest two results stay whole
    for index in stubs:
        assert f"artifact m{index}" in out.messages[index]["content"]
        assert "reservation_id" not in conversation[index]["content"]  # not a snapshot
    assert out.saved_tokens > 0 and out.boundary == 0  # masked, nothing compacted


def test_masking_moves_a_chunk_at_a_time_and_only_forward() -> None:
    trimmer = Trimmer(MASKED, ByteEstimate())
    previous: list[dict[str, Any]] | None = None
    masked_before: frozenset[int] = frozenset()
    chunks = 0
    sent = [r for r in requests(coding_conversation(14)) if r[-1]["role"] in ("user", "tool")]
    for request in sent:
        out = trimmer.trim(request, 0)
        assert not out.fell_back
        masked = frozenset(
            i for i, m in enumerate(out.messages) if "tool output elided" in str(m.get("content"))
        )
        assert masked >= masked_before  # a masked result stays masked
        if masked == masked_before and previous is not None:
            assert out.messages[: len(previous)] == previous  # byte for byte
        elif masked != masked_before:
            chunks += 1
            newly = sum(trimmer._message_tokens(request[i]) for i in masked - masked_before)
            assert newly >= MASKING.clear_at_least_tokens - 200  # a chunk, not one result
        previous, masked_before = out.messages, masked
    assert chunks >= 2


def test_nothing_is_masked_below_a_chunk() -> None:
    conversation = coding_conversation(3)
    sizes = Trimmer(MASKED, ByteEstimate())._message_tokens
    big = MaskingSpec(keep_last_tool_uses=0, min_tokens=1, clear_at_least_tokens=10**9)
    assert masked_results(conversation, 1, set(), sizes, big) == frozenset()
