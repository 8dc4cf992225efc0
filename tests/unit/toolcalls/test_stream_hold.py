"""The stream hold on its own: text passes untouched and unparsed, each call leaves whole
once the next begins or the answer ends, in order, and a refused one becomes text."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.chat.stream import ChatEvent
from gateway.policy import parse_policy
from gateway.telemetry.metrics import GatewayMetrics
from gateway.toolcalls.checker import ToolCallChecks
from gateway.toolcalls.stream_hold import ToolCallHold

TOOL = {"type": "function", "function": {"name": "look", "parameters": {
    "type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}}  # fmt: skip
POLICY = (
    "pools: {p: {served_model: m, replicas: [{url: 'http://a.test:1'}]}}\nmodels: {m: {pool: p}}\n"
)


def hold(tool_calls: str = "{refuse_as: message, on_invalid: [refuse]}") -> ToolCallHold:
    policy = parse_policy(POLICY + f"tool_calls: {tool_calls}\n")
    check = ToolCallChecks(policy.tool_calls, GatewayMetrics()).for_request("m", [TOOL], None)
    assert check is not None
    return ToolCallHold(check)


def event(delta: dict[str, Any], finish: str | None = None) -> ChatEvent:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return ChatEvent(b"data: " + orjson.dumps(chunk) + b"\n\n")


def piece(index: int, arguments: str, name: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if name:
        call.update(id=f"call_{index}", type="function")
        call["function"]["name"] = name
    return {"tool_calls": [call]}


def deltas(events: list[ChatEvent]) -> list[tuple[dict[str, Any], str | None]]:
    """(delta, finish reason) of every choice the events carry."""
    found: list[tuple[dict[str, Any], str | None]] = []
    for each in events:
        for chunk in each.chunks():
            assert isinstance(chunk, dict)
            found += [(c["delta"], c["finish_reason"]) for c in chunk["choices"]]
    return found


async def test_text_passes_as_the_same_bytes() -> None:
    text = event({"content": "Let me look."})
    assert (await hold().take(text)) == [text]
    assert (await hold().take(text))[0] is text


async def test_parallel_calls_leave_whole_and_in_order_and_a_bad_one_becomes_text() -> None:
    h = hold()
    out: list[ChatEvent] = []
    for each in (
        event(piece(0, '{"id": ', "look")),
        event(piece(0, '"A1"}')),
        event(piece(1, '{"nope": 1}', "look")),  # completes call 0: it leaves now
        event(piece(2, '{"id": "B2"}', "look")),
        event({}, "tool_calls"),
    ):
        out += await h.take(each)
    seen = deltas(out)
    sent_calls = [d["tool_calls"][0] for d, _ in seen if d.get("tool_calls")]
    assert [(c["index"], c["id"], c["function"]["arguments"]) for c in sent_calls] == [
        (0, "call_0", '{"id": "A1"}'),
        (1, "call_2", '{"id": "B2"}'),
    ]
    texts = [d["content"] for d, _ in seen if d.get("content")]
    assert len(texts) == 1 and "'id' is a required property" in texts[0]
    assert seen[-1][1] == "tool_calls"  # calls were sent: the finish stays
