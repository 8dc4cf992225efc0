"""Answers the gateway writes itself, in the engine's shapes: a chat completion, or the
events of a chat completion stream, holding one assistant message (text, or tool calls).
Agent frameworks read them exactly as they read the engine's."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from gateway.chat.messages import Message
from gateway.chat.sse import data_event
from gateway.delivery.whole import Answer

NO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def gateway_answer(
    message: Message,
    *,
    model: str,
    stream: bool,
    usage: dict[str, Any] | None,
    include_usage: bool,
    completion_id: str | None = None,
) -> Answer:
    """`message`: an assistant message; its finish reason follows from it (tool_calls when
    it calls tools, else stop). `include_usage`: a stream ends with the usage chunk (the
    client asked for it with `stream_options.include_usage`)."""
    usage = usage or NO_USAGE
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    head = {
        "id": completion_id or f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": model,
    }
    if not stream:
        payload = {
            **head,
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": usage,
        }
        return Answer(message, usage, orjson.dumps(payload))
    chunk = {**head, "object": "chat.completion.chunk"}

    def event(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return data_event(orjson.dumps({**chunk, "choices": [choice]}))

    events = [event({"role": "assistant", "content": ""})]
    if message.get("content"):
        events.append(event({"content": message["content"]}))
    if message.get("tool_calls"):
        calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        events.append(event({"tool_calls": calls}))
    events.append(event({}, finish))
    if include_usage:
        events.append(data_event(orjson.dumps({**chunk, "choices": [], "usage": usage})))
    events.append(data_event(b"[DONE]"))
    return Answer(message, usage, events=events)
