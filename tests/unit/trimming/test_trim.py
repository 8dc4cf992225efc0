"""Trimming: lossless diffs, watermark compaction that keeps the prefix stable, validity."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import orjson
import pytest

from gateway.chat.replies import normalise
from gateway.policy import load_policy
from gateway.policy.sessions import StateToolSpec, TrimmingSpec
from gateway.trimming.conversation import problems, tool_results
from gateway.trimming.tokens import ByteEstimate, TiktokenCounter
from gateway.trimming.trim import BLOCK_FOOTER, BLOCK_HEADER, Trimmer
from tests.conftest import ROOT, SHARED_DATA

SPEC = TrimmingSpec(
    enabled=True,
    high_water_tokens=400,
    low_water_tokens=120,
    state_tools={
        "get_reservation": StateToolSpec(entity="reservation", id_field="reservation_id"),
        "get_user": StateToolSpec(entity="user", id_argument="user_id"),
    },
)
SYSTEM = {"role": "system", "content": "You are an airline agent."}


def call(name: str, arguments: dict[str, Any], call_id: str = "c1") -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [{"id": call_id, "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)}}],
    }  # fmt: skip


def result(content: Any, call_id: str = "c1") -> dict[str, Any]:
    text = content if isinstance(content, str) else json.dumps(content)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


RES_V1 = {"reservation_id": "R1", "cabin": "business", "flights": [{"n": "HAT1", "price": 900}]}
RES_V2 = {"reservation_id": "R1", "cabin": "economy", "flights": [{"n": "HAT1", "price": 300}]}


def trimmer(spec: TrimmingSpec = SPEC) -> Trimmer:
    return Trimmer(spec, ByteEstimate())


def test_a_later_snapshot_travels_as_a_verified_patch() -> None:
    conversation = [
        SYSTEM, user("Downgrade R1"),
        call("get_reservation", {"reservation_id": "R1"}), result(RES_V1),
        call("update", {"reservation_id": "R1"}), result("ok"),
        call("get_reservation", {"reservation_id": "R1"}, "c1"), result(RES_V2, "c1"),
    ]  # fmt: skip
    out = trimmer().trim(conversation, 0)
    assert out.patches == 1 and out.boundary == 0
    assert out.messages[3] == conversation[3]  # the first snapshot goes whole
    text = out.messages[7]["content"]
    assert text.startswith("JSON Patch (RFC 6902) of reservation:R1 against its previous state")
    ops = orjson.loads(text[text.index(": [") + 2 :])
    assert jsonpatch.apply_patch(RES_V1, ops) == RES_V2
    assert out.messages[:7] == conversation[:7]


def test_a_snapshot_failing_its_schema_goes_whole_and_is_counted() -> None:
    strict = SPEC.model_copy(
        update={
            "state_tools": {
                "get_reservation": StateToolSpec.model_validate({
                    "entity": "reservation", "id_field": "reservation_id",
                    "schema": {"type": "object", "required": ["status"]},
                })
            }
        }
    )  # fmt: skip
    conversation = [
        SYSTEM, user("x"),
        call("get_reservation", {}), result(RES_V1),
        call("get_reservation", {}), result(RES_V2),
    ]  # fmt: skip
    out = trimmer(strict).trim(conversation, 0)
    assert out.patches == 0 and out.schema_failures == 2
    assert out.messages == conversation


def long_conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [SYSTEM]
    for t in range(turns):
        messages += [
            user(f"Question {t}: find me flights, please."),
            call("search", {"day": t}, "dup"),  # the same id every time, as real agents do
            result([{"flight": f"HAT{t}{i}", "price": 100 + i} for i in range(12)], "dup"),
            call("get_reservation", {"reservation_id": "R1"}, "dup"),
            result({**RES_V1, "note": f"seen on turn {t}"}, "dup"),
            {"role": "assistant", "content": f"Here are the options for day {t}."},
        ]
    return messages


def requests(conversation: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What an agent sends before each assistant message: everything before it."""
    return [conversation[:i] for i, m in enumerate(conversation) if m["role"] == "assistant"]


def test_compaction_folds_the_past_into_one_valid_block() -> None:
    conversation = [*long_conversation(8), user("And now?")]
    out = trimmer().trim(conversation, 0)
    assert out.boundary > 0
    assert problems(out.messages) == []
    block = out.messages[1]["content"]
    block = block if isinstance(block, str) else block[0]["text"]
    assert block.startswith(BLOCK_HEADER)
    for t in range(8):  # every user message, verbatim
        assert f"Question {t}: find me flights, please." in json.dumps(out.messages)
    assert "state reservation:R1 = " in block
    assert "artifact m3" in block and "/v1/sessions/{session}/artifacts/" in block
    assert out.history_tokens < trimmer().history_tokens(conversation)


def block_of(messages: list[dict[str, Any]]) -> str:
    content = messages[1]["content"]
    return str(content if isinstance(content, str) else content[0]["text"])


def test_between_compactions_each_context_extends_the_previous_one() -> None:
    t = trimmer()
    boundary, previous, moves = 0, None, 0
    for request in requests(long_conversation(10)):
        out = t.trim(request, boundary)
        assert problems(out.messages) == []
        if out.boundary != boundary:
            moves += 1
            assert out.boundary > boundary  # the boundary only ever moves forward
            if previous is not None and boundary:
                # The block is a log: a new block starts with the old one (its footer
                # aside), so the engine's cache still holds everything before the new part.
                old = block_of(previous).removesuffix(BLOCK_FOOTER)
                assert block_of(out.messages).startswith(old)
        elif previous is not None:
            assert out.messages[: len(previous)] == previous  # byte for byte
        boundary, previous = out.boundary, out.messages
    assert moves >= 2


def test_pairing_is_by_position_even_with_reused_ids_and_parallel_calls() -> None:
    parallel = {
        "role": "assistant",
        "tool_calls": [
            {"id": "same", "type": "function", "function": {"name": "a", "arguments": "{}"}},
            {"id": "same", "type": "function", "function": {"name": "b", "arguments": "{}"}},
        ],
    }
    conversation = [SYSTEM, user("go"), parallel, result("A", "same"), result("B", "same")]
    assert problems(conversation) == []
    paired = tool_results(conversation)
    assert [paired[3].name, paired[4].name] == ["a", "b"]


@pytest.mark.parametrize(
    ("conversation", "problem"),
    [
        ([SYSTEM, user("a"), result("orphan")], "tool result without a call"),
        ([SYSTEM, user("a"), call("f", {}), user("b")], "without results"),
        ([SYSTEM, user("a"), user("b")], "two user messages in a row"),
        ([SYSTEM, user("a"), SYSTEM, user("b")], "system message after"),
        ([SYSTEM, {"role": "assistant", "content": "hi"}, user("a")], "does not start"),
    ],
)
def test_invalid_conversations_are_named(conversation: list[Any], problem: str) -> None:
    assert any(problem in p for p in problems(conversation))


def test_an_invalid_context_is_never_trimmed_into_something_else() -> None:
    broken = [*long_conversation(8), user("x"), result("orphan")]
    out = trimmer().trim(broken, 0)
    assert out.fell_back
    assert out.messages == broken


def test_the_tau_bench_policy_trims_real_conversations_validly() -> None:
    spec = load_policy(ROOT / "policies" / "agent-airline.yaml").trimming
    t = Trimmer(spec, ByteEstimate())
    path = SHARED_DATA / "agent-trajectories" / "tau_bench_airline_dev.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()[:10]]
    for record in records:
        boundary = 0
        for request in requests([normalise(m) for m in record["messages"]]):
            out = t.trim(request, boundary)
            assert not out.fell_back and problems(out.messages) == []
            boundary = out.boundary


def test_o200k_base_loads_offline_from_the_shipped_file() -> None:
    counter = TiktokenCounter()
    assert counter.count("hello world") == 2
