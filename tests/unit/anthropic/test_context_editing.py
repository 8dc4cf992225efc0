"""Anthropic's context editing (`context_management.edits`) applied by the gateway: what the
engine is sent, what the answer reports (whole, streamed and counted, through the real
`anthropic` SDK's beta API), and the edits' checks."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from starlette.testclient import TestClient

from gateway.anthropic.context_editing import (
    CLEARED_RESULT,
    ClearThinking,
    ClearToolUses,
    Tally,
    apply_edits,
    parse_edits,
)
from gateway.anthropic.convert import chat_request
from gateway.errors import InvalidRequest
from gateway.trimming.tokens import ByteEstimate
from tests.fakes import FakeUpstream
from tests.unit.anthropic.test_messages_app import sdk, sent
from tests.unit.anthropic.twin import WEATHER

BETA = ["context-management-2025-06-27"]
READ: Any = {
    "name": "read_file",
    "description": "A file's text.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def history(uses: int, *, tool: str = "read_file", size: int = 400) -> list[Any]:
    """A coding agent's history: a question, then `uses` tool uses, each answered."""
    turns: list[dict[str, Any]] = [{"role": "user", "content": "Summarise the repository."}]
    for i in range(uses):
        turns.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Reading {i}."},
            {"type": "tool_use", "id": f"toolu_{i}", "name": tool, "input": {"path": f"f{i}.py"}},
        ]})  # fmt: skip
        turns.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"{i}" * size},
        ]})  # fmt: skip
    return turns


def chat_messages(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    request = {"model": "tiny", "max_tokens": 8, "messages": turns}
    messages: list[dict[str, Any]] = chat_request(request).body["messages"]
    return messages


def results(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


# The edits on the conversation


def test_past_the_trigger_all_but_the_last_tool_uses_are_cleared_oldest_first() -> None:
    messages = chat_messages(history(6))
    edits = parse_edits({"edits": [{
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 500},
        "keep": {"type": "tool_uses", "value": 2},
    }]})  # fmt: skip
    assert edits is not None
    edited = apply_edits(edits, messages, None, Tally(ByteEstimate()))
    assert results(edited.messages) == [CLEARED_RESULT] * 4 + ["4" * 400, "5" * 400]
    ((report),) = edited.applied
    assert report["type"] == "clear_tool_uses_20250919" and report["cleared_tool_uses"] == 4
    rendered = ByteEstimate().count  # a tool message renders as `tool\n<content>`
    each = rendered("tool\n" + "0" * 400) - rendered("tool\n" + CLEARED_RESULT)
    assert report["cleared_input_tokens"] == 4 * each
    # the calls themselves are kept, and what the client sent is not changed
    assert [m["tool_calls"][0]["function"]["arguments"] for m in edited.messages[1::2]] == [
        f'{{"path": "f{i}.py"}}' for i in range(6)
    ]
    assert results(messages) == [f"{i}" * 400 for i in range(6)]


def test_under_the_trigger_nothing_is_cleared_nor_tokenized() -> None:
    class Refuses(ByteEstimate):
        def count(self, text: str) -> int:
            raise AssertionError("tokenized a prompt under the trigger")

    messages = chat_messages(history(6))
    edits = parse_edits({"edits": [{"type": "clear_tool_uses_20250919"}]})  # 100,000 tokens
    assert edits is not None
    edited = apply_edits(edits, messages, None, Tally(Refuses()))
    assert edited.messages is messages and edited.applied == []


def test_a_tool_uses_trigger_excluded_tools_and_cleared_inputs() -> None:
    turns = history(4)
    turns[1]["content"][1]["name"] = "memory"  # the first use is of a tool never cleared
    messages = chat_messages(turns)
    edits = parse_edits({"edits": [{
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 3},
        "keep": {"type": "tool_uses", "value": 1},
        "exclude_tools": ["memory"],
        "clear_tool_inputs": ["read_file"],
    }]})  # fmt: skip
    assert edits is not None
    edited = apply_edits(edits, messages, None, Tally(ByteEstimate()))
    assert results(edited.messages) == ["0" * 400, CLEARED_RESULT, CLEARED_RESULT, "3" * 400]
    arguments = [m["tool_calls"][0]["function"]["arguments"] for m in edited.messages[1::2]]
    assert arguments == ['{"path": "f0.py"}', "{}", "{}", '{"path": "f3.py"}']
    assert edited.applied[0]["cleared_tool_uses"] == 2
    # three uses are not more than three: not triggered
    assert apply_edits(edits, chat_messages(history(3)), None, Tally(ByteEstimate())).applied == []


def test_a_tool_uses_trigger_tokenizes_only_what_it_clears() -> None:
    """Claude Code's edit (a `tool_uses` trigger): a 195K-token history is not tokenized
    whole every turn, only the results cleared and their placeholders."""
    counted: list[str] = []

    class Recording(ByteEstimate):
        def count(self, text: str) -> int:
            counted.append(text)
            return super().count(text)

    messages = chat_messages(history(6))
    edits = parse_edits({"edits": [{
        "type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 4}}]})  # fmt: skip
    assert edits is not None
    edited = apply_edits(edits, messages, None, Tally(Recording()))
    assert edited.applied[0]["cleared_tool_uses"] == 3
    assert sorted(counted) == sorted(
        [f"tool\n{i}" + f"{i}" * 399 for i in range(3)] + [f"tool\n{CLEARED_RESULT}"] * 3
    )


def test_clear_at_least_leaves_the_prompt_whole_when_clearing_would_save_less() -> None:
    messages = chat_messages(history(5, size=40))
    edit: dict[str, Any] = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 1},
        "clear_at_least": {"type": "input_tokens", "value": 1000},
    }
    edits = parse_edits({"edits": [edit]})
    assert edits is not None
    edited = apply_edits(edits, messages, None, Tally(ByteEstimate()))
    assert edited.messages is messages and edited.applied == []
    edit["clear_at_least"]["value"] = 1
    edits = parse_edits({"edits": [edit]})
    assert edits is not None
    assert (
        apply_edits(edits, messages, None, Tally(ByteEstimate())).applied[0]["cleared_tool_uses"]
        == 2
    )


def test_the_same_history_is_edited_the_same_way_every_turn() -> None:
    """Stateless: what the engine's cache holds from the last turn is the next one's prefix,
    up to the one result newly cleared."""
    edits = parse_edits({"edits": [{
        "type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2}}]})  # fmt: skip
    assert edits is not None
    tally = Tally(ByteEstimate())
    turn_5 = apply_edits(edits, chat_messages(history(5)), None, tally).messages
    turn_6 = apply_edits(edits, chat_messages(history(6)), None, tally).messages
    # the same up to the result newly cleared (the 4th last use's, toolu_2, at 6)
    assert turn_6[:6] == turn_5[:6]
    assert turn_5[6]["content"] == "2" * 400 and turn_6[6]["content"] == CLEARED_RESULT
    assert apply_edits(edits, chat_messages(history(6)), None, tally).messages == turn_6


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ([], "context_management"),
        ({"edits": {}}, "context_management.edits"),
        ({"edits": [], "extra": 1}, "context_management.extra"),
        ({"edits": [{"type": "clear_everything"}]}, "context_management.edits.0.type"),
        (
            {"edits": [{"type": "compact_20260112", "instructions": "Keep the numbers."}]},
            "context_management.edits.0.instructions",
        ),
        (
            {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 10}}]},
            "context_management.edits.0.trigger.value",
        ),
        (
            {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "turns", "value": 3}}]},
            "context_management.edits.0.trigger.type",
        ),
        (
            {"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}]},
            "context_management.edits.0.keep.value",
        ),
        (
            {"edits": [{"type": "clear_tool_uses_20250919", "exclude_tools": "memory"}]},
            "context_management.edits.0.exclude_tools",
        ),
        (
            {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}]},
            "context_management.edits.0.keep.value",
        ),
        (
            {"edits": [{"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015"}]},
            "context_management.edits.1.type",
        ),
    ],
)  # fmt: skip
def test_bad_edits_are_refused_naming_the_field(value: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_edits(value)
    assert refused.value.param == param


def test_the_edits_claude_code_sends_are_taken() -> None:
    """Claude Code 2.1 sends this on every request with thinking on."""
    edits = parse_edits({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]})
    assert edits == (ClearThinking(keep=None),)
    default = parse_edits({"edits": [{"type": "clear_tool_uses_20250919"}]})
    assert default == (ClearToolUses("input_tokens", 100_000, 3, None, frozenset(), False),)


# Through the app and Anthropic's SDK


CLEAR: Any = {"edits": [
    {"type": "clear_thinking_20251015", "keep": "all"},
    {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 3},
     "keep": {"type": "tool_uses", "value": 1}},
]}  # fmt: skip


def test_the_engine_gets_the_edited_history_and_the_answer_says_what_was_cleared(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    message = sdk(client).beta.messages.create(
        model="tiny", max_tokens=64, messages=history(4), tools=[READ, WEATHER],
        context_management=CLEAR, betas=BETA,
    )  # fmt: skip
    assert results(sent(fake)["messages"]) == [CLEARED_RESULT] * 3 + ["3" * 400]
    assert message.context_management is not None
    (applied,) = message.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919" and applied.cleared_tool_uses == 3
    assert applied.cleared_input_tokens > 0
    # streamed: the same edits, reported in `message_delta`
    with sdk(client).beta.messages.stream(
        model="tiny", max_tokens=64, messages=history(4), tools=[READ],
        context_management=CLEAR, betas=BETA,
    ) as stream:  # fmt: skip
        final = stream.get_final_message()
    assert results(sent(fake)["messages"]) == [CLEARED_RESULT] * 3 + ["3" * 400]
    assert final.context_management is not None
    (streamed,) = final.context_management.applied_edits
    assert streamed.type == "clear_tool_uses_20250919" and streamed.cleared_tool_uses == 3
    # nothing to clear: the answer says so, and the history goes as it came
    quiet = sdk(client).beta.messages.create(
        model="tiny", max_tokens=64, messages=history(2), tools=[READ],
        context_management=CLEAR, betas=BETA,
    )  # fmt: skip
    assert quiet.context_management is not None and quiet.context_management.applied_edits == []
    assert results(sent(fake)["messages"]) == ["0" * 400, "1" * 400]
    metrics = client.get("/metrics").text
    assert 'gateway_context_edits_total{api="messages",edit="clear_tool_uses"} 2.0' in metrics
    # and a request without `context_management` is answered as before
    plain = client.post(
        "/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": history(4)}
    )
    assert "context_management" not in plain.json()


def test_count_tokens_counts_the_edited_prompt_and_the_original(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    counted = sdk(client).beta.messages.count_tokens(
        model="tiny", messages=history(4), tools=[READ], context_management=CLEAR, betas=BETA
    )
    assert counted.input_tokens == 42  # the engine twin counts 42 whatever it is asked
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == 42
    asked = [c for c in fake.calls if c.url.endswith("/tokenize")]
    assert len(asked) == 2 and CLEARED_RESULT.encode() in asked[0].body
    assert CLEARED_RESULT.encode() not in asked[1].body


def test_a_bad_edit_is_an_anthropic_400_before_any_engine_is_asked(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    calls = len(fake.calls)
    compact: Any = {"edits": [{"type": "compact_20260112", "instructions": "Be terse."}]}
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk(client).beta.messages.create(
            model="tiny", max_tokens=8, messages=history(1), betas=BETA,
            context_management=compact,
        )  # fmt: skip
    assert "instructions" in str(refused.value)
    assert len(fake.calls) == calls


def thoughtful(turns: int) -> list[Any]:
    """A history whose every assistant message thought before it called a tool."""
    history_: list[Any] = [{"role": "user", "content": "Read three files."}]
    for i in range(turns):
        history_ += [
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": f"thought {i}", "signature": "sig"},
                {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file",
                 "input": {"path": f"f{i}.py"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "text"}]},
        ]  # fmt: skip
    return history_


def reasoning_sent(fake: FakeUpstream) -> list[str | None]:
    return [m.get("reasoning") for m in sent(fake)["messages"] if m["role"] == "assistant"]


@pytest.mark.parametrize(
    ("thinking", "edits", "kept", "cleared"),
    [
        # Anthropic's default: the last assistant message's thinking, with thinking on
        ({"type": "enabled", "budget_tokens": 1024}, None, [None, None, "thought 2"], None),
        # Claude Code's edit: all of it (the engine's cached prefix stays whole)
        ({"type": "adaptive"}, [{"type": "clear_thinking_20251015", "keep": "all"}],
         ["thought 0", "thought 1", "thought 2"], None),
        ({"type": "adaptive"},
         [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}}],
         [None, "thought 1", "thought 2"], 1),
        # thinking off: no past thought is read, whatever the edits say
        (None, [{"type": "clear_thinking_20251015", "keep": "all"}], [None, None, None], None),
    ],
)  # fmt: skip
def test_the_history_s_thinking_reaches_the_engine_for_the_turns_kept(
    app: tuple[TestClient, FakeUpstream],
    thinking: Any,
    edits: Any,
    kept: list[str | None],
    cleared: int | None,
) -> None:
    client, fake = app
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "messages": thoughtful(3)}
    if thinking is not None:
        body["thinking"] = thinking
    if edits is not None:
        body["context_management"] = {"edits": edits}
    answer = client.post("/v1/messages", json=body)
    assert answer.status_code == 200, answer.text
    assert reasoning_sent(fake) == kept
    applied = answer.json().get("context_management", {}).get("applied_edits", [])
    if cleared is None:
        assert applied == []
    else:
        (edit,) = applied
        assert edit["type"] == "clear_thinking_20251015"
        assert edit["cleared_thinking_turns"] == cleared and edit["cleared_input_tokens"] > 0
