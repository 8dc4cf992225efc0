"""Anthropic's server-side compaction on the gateway's trimming, through the real app (engine
twin, real Redis) and the `anthropic` SDK's beta API: `compact_20260112` past its trigger,
`pause_after_compaction`, the top-level `compaction`, and the block sent back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic import beta_tool
from starlette.testclient import TestClient

from gateway.responses.compaction import PREFIX
from tests.fakes import FakeUpstream
from tests.unit.anthropic.test_context_editing import READ, chat_messages, history
from tests.unit.anthropic.test_messages_app import sdk

BETA = ["compact-2026-01-12", "context-management-2025-06-27"]
SYSTEM = "You read repositories."


def compact(trigger: int, *, pause: bool = False) -> Any:
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": trigger}}
    return {"edits": [{**edit, "pause_after_compaction": pause}]}


def engine_messages(fake: FakeUpstream) -> list[dict[str, Any]]:
    chat = [c for c in fake.calls if c.url.endswith("/chat/completions")]
    messages: list[dict[str, Any]] = orjson.loads(chat[-1].body)["messages"]
    return messages


def test_past_the_trigger_the_engine_reads_the_compacted_conversation_and_the_block_leads(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    turns = history(12)  # about 1,300 tokens of tool results
    message = sdk(client).beta.messages.create(
        model="tiny", max_tokens=64, system=SYSTEM, messages=turns, tools=[READ],
        context_management=compact(1000), betas=BETA,
    )  # fmt: skip
    first = message.content[0]
    assert first.type == "compaction"
    assert first.encrypted_content is not None and first.encrypted_content.startswith(PREFIX)
    assert first.content and "Summarise the repository." in first.content
    assert [b.type for b in message.content[1:]] == ["text"]  # then the engine's answer
    assert message.stop_reason == "end_turn"
    sent = engine_messages(fake)
    assert sent[0] == {"role": "system", "content": SYSTEM}
    assert len(sent) < 1 + len(turns) * 2 - 12  # folded: fewer messages than the history's

    # The next turn sends the answer back: everything before the block is dropped and the
    # kept conversation put in its place, byte for byte what the engine read last turn.
    answer: Any = {
        "role": "assistant",
        "content": [b.model_dump(exclude_none=True) for b in message.content],
    }
    nxt = [*turns, answer, {"role": "user", "content": "And the tests?"}]
    sdk(client).beta.messages.create(
        model="tiny", max_tokens=64, system=SYSTEM, messages=nxt, tools=[READ],
        context_management=compact(1000), betas=BETA,
    )  # fmt: skip
    again = engine_messages(fake)
    assert again[: len(sent)] == sent  # the engine's cached prefix holds
    metrics = client.get("/metrics").text
    assert 'gateway_context_edits_total{api="messages",edit="compaction"} 1.0' in metrics
    assert again[len(sent) :] == [
        {"role": "assistant", "content": "Sunny today"},
        {"role": "user", "content": "And the tests?"},
    ]


def test_under_the_trigger_nothing_is_compacted(app: tuple[TestClient, FakeUpstream]) -> None:
    client, fake = app
    message = sdk(client).beta.messages.create(
        model="tiny", max_tokens=64, messages=history(2), tools=[READ],
        context_management=compact(100_000), betas=BETA,
    )  # fmt: skip
    assert [b.type for b in message.content] == ["text"]
    assert len(engine_messages(fake)) == 5


def test_a_block_whose_conversation_is_unknown_stands_for_its_own_text(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    """Expired, or made by another gateway (or Anthropic's API): its summary is still there."""
    client, fake = app
    for handle in (PREFIX + "0" * 32, "EsYBCkYIBhgC...anthropic"):
        turns: Any = [
            {"role": "user", "content": "old question"},
            {"role": "assistant", "content": [
                {"type": "compaction", "content": "We read 12 files.", "encrypted_content": handle},
                {"type": "text", "text": "Done reading."}]},
            {"role": "user", "content": "Now the tests?"},
        ]  # fmt: skip
        sdk(client).beta.messages.create(model="tiny", max_tokens=8, messages=turns, betas=BETA)
        assert engine_messages(fake) == [
            {"role": "user", "content": "We read 12 files."},
            {"role": "assistant", "content": "Done reading."},
            {"role": "user", "content": "Now the tests?"},
        ]


def test_a_failed_compaction_block_is_nothing(app: tuple[TestClient, FakeUpstream]) -> None:
    client, fake = app
    turns: Any = [
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": [{"type": "compaction", "content": None},
                                          {"type": "text", "text": "Answer."}]},
        {"role": "user", "content": "Next?"},
    ]  # fmt: skip
    sdk(client).beta.messages.create(model="tiny", max_tokens=8, messages=turns, betas=BETA)
    assert engine_messages(fake) == [
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "Answer."},
        {"role": "user", "content": "Next?"},
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_paused_or_asked_outright_the_block_is_the_whole_answer(
    app: tuple[TestClient, FakeUpstream], stream: bool
) -> None:
    client, fake = app
    calls = len(fake.calls)
    fields: Any = {"model": "tiny", "max_tokens": 64, "messages": history(12), "tools": [READ]}
    asks: list[Any] = [
        {"context_management": compact(1000, pause=True), "betas": BETA},
        {"compaction": {"type": "summarize"}, "betas": ["compact-2026-09-04"]},
    ]
    for ask in asks:
        if stream:
            with sdk(client).beta.messages.stream(**fields, **ask) as events:
                message = events.get_final_message()
        else:
            message = sdk(client).beta.messages.create(**fields, **ask)
        assert message.stop_reason == "compaction"
        (block,) = message.content
        assert block.type == "compaction" and block.content
        assert block.encrypted_content and block.encrypted_content.startswith(PREFIX)
    assert len(fake.calls) == calls  # no engine was asked


def test_summary_instructions_are_refused_not_dropped(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, _ = app
    raw = client.post(
        "/v1/messages",
        json={"model": "tiny", "max_tokens": 8, "messages": history(1),
              "compaction": {"type": "summarize", "instructions": "Keep the numbers."}},
    )  # fmt: skip
    assert raw.status_code == 400
    assert raw.json()["error"]["type"] == "invalid_request_error"
    assert "instructions" in raw.json()["error"]["message"]
    blank = client.post(
        "/v1/messages",
        json={"model": "tiny", "max_tokens": 8, "messages": history(1),
              "compaction": {"type": "summarize", "instructions": "  "}},
    )  # fmt: skip
    assert blank.status_code == 200 and blank.json()["stop_reason"] == "compaction"


def test_an_answer_without_the_engine_is_refused_as_the_engine_s_would_be(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    """Found by the OpenAPI fuzzer: a compaction-only answer echoed a model nobody may use."""
    client, _ = app
    for fields in ({"model": "nobody", "messages": history(1)}, {"model": "tiny", "messages": []}):
        raw = client.post(
            "/v1/messages",
            json={**fields, "max_tokens": 8, "compaction": {"type": "summarize"}},
        )
        assert raw.status_code in (400, 404), raw.text
        assert raw.json()["type"] == "error"


def test_the_sdk_s_tool_runner_compacts_through_the_gateway(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    """Anthropic's own agent loop (`tool_runner`), asked to compact before its next turn:
    it takes the block, replaces its history with it, and carries on; the engine reads the
    folded conversation."""
    client, fake = app

    @beta_tool
    def read_file(path: str) -> str:
        """A file's text."""
        return path

    turns = history(40)  # past the trimming's low-water mark: there is something to fold
    runner = sdk(client).beta.messages.tool_runner(
        model="tiny", max_tokens=64, messages=turns, tools=[read_file]
    )
    runner.compact_before_next_turn()
    reasons = [message.stop_reason for message in runner]
    assert reasons == ["compaction", "end_turn"]
    sent = engine_messages(fake)
    assert len(sent) < len(chat_messages(turns)) // 2
    assert any("Summarise the repository." in str(m.get("content")) for m in sent)
