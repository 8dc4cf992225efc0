"""The engine's chat completion as an Anthropic Message: its reasoning, text and tool calls
as content blocks, `finish_reason` as `stop_reason`, and usage in Anthropic's terms
(`usage_of`). Used for whole answers here and, chunk by chunk, by gateway/anthropic/stream.py.
"""

from __future__ import annotations

from typing import Any

import orjson


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic's three input counts add up to the prompt: read from the cache (vLLM's
    `cached_tokens`), written to it (vLLM 0.32's `created_cache_tokens`, as vLLM's own
    Messages API counts them), and the rest."""
    details = (chat_usage or {}).get("prompt_tokens_details") or {}
    prompt = int((chat_usage or {}).get("prompt_tokens") or 0)
    cached = min(int(details.get("cached_tokens") or 0), prompt)
    created = min(int(details.get("created_cache_tokens") or 0), prompt - cached)
    return {
        "input_tokens": prompt - cached - created,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": cached,
        "output_tokens": int((chat_usage or {}).get("completion_tokens") or 0),
    }


def stop_reason(
    finish_reason: Any, engine_stop: Any, request: dict[str, Any], called: bool
) -> tuple[str, str | None]:
    """Anthropic's `stop_reason` and `stop_sequence` for the engine's finish reason (and
    vLLM's `stop_reason`: the stop string that ended the answer)."""
    if called or finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(engine_stop, str) and engine_stop in (request.get("stop_sequences") or ()):
        return "stop_sequence", engine_stop
    return "end_turn", None


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the `input` object; arguments that are not a JSON object
    are kept whole under `arguments` rather than lost."""
    try:
        parsed = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


def message_shell(message_id: str, request: dict[str, Any]) -> dict[str, Any]:
    """A Message with nothing in it yet: what a stream's `message_start` carries, and what
    every answer fills in."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": request["model"],
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage_of(None),
    }


def message_object(
    message_id: str, request: dict[str, Any], completion: dict[str, Any], thinking: bool
) -> dict[str, Any]:
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if thinking and isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    calls = message.get("tool_calls") or ()
    for call in calls:
        function = call.get("function") or {}
        content.append({
            "type": "tool_use",
            "id": call.get("id") or f"toolu_{message_id[4:]}_{len(content)}",
            "name": function.get("name") or "",
            "input": tool_input(function.get("arguments") or ""),
        })  # fmt: skip
    reason, sequence = stop_reason(
        choice.get("finish_reason"), choice.get("stop_reason"), request, bool(calls)
    )
    return {
        **message_shell(message_id, request),
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_of(completion.get("usage")),
    }
