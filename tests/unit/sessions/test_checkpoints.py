"""Checkpoints fold into the conversation; replies become history messages; keys."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.chat.replies import ReplyCollector, normalise, reply_of
from gateway.errors import InvalidRequest
from gateway.policy.sessions import SessionsSpec
from gateway.sessions.checkpoints import (
    Checkpoint,
    engine_request,
    history,
    new_messages,
    split_engine_request,
)
from gateway.sessions.ids import SessionRef, session_for
from gateway.sessions.turns import context_mode

SYSTEM: dict[str, Any] = {"role": "system", "content": "Be brief."}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def checkpoint(new: list[dict[str, Any]], reply: str, *, rewrite: bool = False) -> Checkpoint:
    return Checkpoint(
        created_at=0.0,
        request_id="r",
        model="m",
        mode="full",
        new_messages=new,
        rewrite=rewrite,
        reply={"role": "assistant", "content": reply},
        engine={"model": "served", "tools": {"$blob": "x"}},
    )


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_history_folds_new_messages_and_replies_in_order() -> None:
    turns = [checkpoint([SYSTEM, user("a")], "A"), checkpoint([user("b")], "B")]
    assert history(turns) == [SYSTEM, user("a"), {"role": "assistant", "content": "A"},
                              user("b"), {"role": "assistant", "content": "B"}]  # fmt: skip
    assert history(turns, with_last_reply=False)[-1] == user("b")
    rewritten = [*turns, checkpoint([SYSTEM, user("c")], "C", rewrite=True)]
    assert history(rewritten) == [SYSTEM, user("c"), {"role": "assistant", "content": "C"}]


def test_new_messages_are_what_extends_the_stored_conversation() -> None:
    stored = [SYSTEM, user("a"), {"role": "assistant", "content": "A"}]
    assert new_messages(stored, [*stored, user("b")]) == ([user("b")], False)
    edited = [SYSTEM, user("a, edited"), user("b")]
    assert new_messages(stored, edited) == (edited, True)
    assert new_messages([], [user("a")]) == ([user("a")], False)


def test_engine_request_is_rebuilt_exactly_with_tools_from_blobs() -> None:
    sent = {"model": "served", "messages": [SYSTEM, user("a")], "tools": TOOLS, "top_k": 3}
    engine, blobs = split_engine_request(sent)
    assert "messages" not in engine
    assert engine["tools"] == {"$blob": next(iter(blobs))}
    first = Checkpoint(0.0, "r", "m", "full", [SYSTEM, user("a")], False,
                       {"role": "assistant", "content": "A"}, engine)  # fmt: skip
    assert engine_request([first], 1, blobs) == sent
    assert orjson.loads(blobs[engine["tools"]["$blob"]]) == TOOLS


def test_checkpoint_json_round_trip() -> None:
    original = checkpoint([user("a")], "A")
    assert Checkpoint.from_json(original.to_json()) == original


def test_normalise_keeps_what_chat_templates_render() -> None:
    from_sdk = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "annotations": [],
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "f", "arguments": "{}"}}],
    }  # fmt: skip
    assert normalise(from_sdk) == {
        "role": "assistant",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    assert normalise({"role": "tool", "tool_call_id": "c1", "content": "ok"}) == {
        "role": "tool", "content": "ok", "tool_call_id": "c1"}  # fmt: skip


def test_reply_of_a_completion_and_of_a_stream_agree() -> None:
    payload = orjson.dumps({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there",
                                             "tool_calls": []}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
    })  # fmt: skip
    whole, usage = reply_of(orjson.loads(payload))
    assert whole == {"role": "assistant", "content": "Hello there"}
    assert usage == {"prompt_tokens": 5, "completion_tokens": 2}
    collector = ReplyCollector()
    for part in ("Hello", " there"):
        chunk = {"choices": [{"index": 0, "delta": {"content": part}}]}
        collector.feed(b"data: " + orjson.dumps(chunk) + b"\n\n")
    collector.feed(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n')
    assert not collector.done
    collector.feed(b"data: [DONE]\n\n")
    assert collector.done
    assert collector.message() == whole
    assert collector.usage == usage


def test_streamed_parallel_tool_calls_are_assembled_by_index() -> None:
    collector = ReplyCollector()
    deltas = [
        {"tool_calls": [{"index": 0, "id": "a", "type": "function",
                         "function": {"name": "f", "arguments": '{"x":'}}]},
        {"tool_calls": [{"index": 1, "id": "b", "type": "function",
                         "function": {"name": "g", "arguments": "{}"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
    ]  # fmt: skip
    for delta in deltas:
        collector.feed(
            b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"
        )
    assert collector.message() == {
        "role": "assistant",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ],
    }


def test_session_key_sources_in_policy_order() -> None:
    body = {"metadata": {"session_id": "meta-1"}, "user": "u-1"}
    header_only = SessionsSpec()
    assert session_for(header_only, "h-1", body) == SessionRef("default", "h-1")
    assert session_for(header_only, None, body) is None
    spec = SessionsSpec(key_from=("metadata", "user", "header"))
    assert session_for(spec, "h-1", body) == SessionRef("default", "meta-1")
    assert session_for(spec, "h-1", {"user": "u-1"}) == SessionRef("default", "u-1")
    with pytest.raises(InvalidRequest) as bad:
        session_for(header_only, "has {braces}", {})
    assert bad.value.param == "X-Session-Id"


def test_keys_of_one_session_share_a_cluster_hash_slot() -> None:
    from redis.crc import key_slot

    session = SessionRef("default", "abc")
    assert key_slot(session.key("turns").encode()) == key_slot(session.key("blobs").encode())


def test_context_mode_header() -> None:
    assert context_mode(None) == "full"
    assert context_mode("Delta") == "delta"
    with pytest.raises(InvalidRequest):
        context_mode("partial")
