"""Legacy function calling: `functions` and `function_call`, translated to tools and back.

OpenAI replaced them with `tools` / `tool_choice` / `tool_calls` in 2023, but older
clients and frameworks still send them, and vLLM ignores them without a word: the reply
comes back with no call (issue 25). So a chat request that uses them is rewritten before
the pipeline sees it, and its answer is rewritten back into the shape its client reads:

- `functions: [f, ...]` -> `tools: [{"type": "function", "function": f}, ...]`;
- `function_call: "auto" | "none" | {"name": n}` -> `tool_choice` ("auto", "none",
  or that function);
- an assistant message's `function_call` -> `tool_calls` with one call, whose id is made
  from the message's position (`call_fn_<index>`), so the same history gets the same
  ids on every turn and the prompt prefix stays byte-stable; the `function` message that
  answers it -> a `tool` message with that id;
- in the answer, the first tool call of each choice -> `message.function_call` (legacy
  calls are one per turn) and `finish_reason: "tool_calls"` -> `"function_call"`; in a
  stream, each chunk's `delta.tool_calls[0].function` -> `delta.function_call`.

Only a request with a top-level `functions` or `function_call` is answered in the legacy
shape; one that only carries legacy messages (a history recorded earlier) has them
translated and is answered with tools. Sending both `functions` and `tools` is refused.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from gateway.chat.sse import data_event
from gateway.chat.stream import DONE, ChatEvent
from gateway.errors import InvalidRequest


def to_tools(body: dict[str, Any]) -> tuple[dict[str, Any], bool] | None:
    """The request with its legacy fields as tools, and whether its answer must be in the
    legacy shape; None when it uses none of them (a look at its keys and each message's:
    every chat request is asked, so this is on the hot path)."""
    legacy_request = "functions" in body or "function_call" in body
    messages = body.get("messages")
    history: list[Any] = messages if isinstance(messages, list) else []
    legacy_messages = any(
        isinstance(m, dict) and (m.get("role") == "function" or m.get("function_call") is not None)
        for m in history
    )
    if not legacy_request and not legacy_messages:
        return None
    out = {k: v for k, v in body.items() if k not in ("functions", "function_call")}
    for legacy, modern, translate in _FIELDS:
        if legacy in body:
            if modern in body:
                raise InvalidRequest(
                    f"Send either `{legacy}` (deprecated) or `{modern}`, not both.",
                    param=legacy,
                    code="invalid_value",
                )
            out[modern] = translate(body[legacy])
    if legacy_messages:
        out["messages"] = _messages(history)
    return out, legacy_request


def _tools(functions: Any) -> list[dict[str, Any]]:
    if not isinstance(functions, list):
        raise InvalidRequest(
            "`functions` must be an array.", param="functions", code="invalid_type"
        )
    tools = []
    for i, function in enumerate(functions):
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(
                f"Missing required parameter: 'functions[{i}].name'.",
                param=f"functions[{i}].name",
                code="missing_required_parameter",
            )
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(function_call: Any) -> Any:
    if function_call in ("auto", "none"):
        return function_call
    if isinstance(function_call, dict) and isinstance(function_call.get("name"), str):
        return {"type": "function", "function": {"name": function_call["name"]}}
    raise InvalidRequest(
        '`function_call` must be "auto", "none" or {"name": ...}.',
        param="function_call",
        code="invalid_value",
    )


# Each legacy request field, the field it becomes, and how.
_FIELDS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("functions", "tools", _tools),
    ("function_call", "tool_choice", _tool_choice),
)


def _messages(messages: list[Any]) -> list[Any]:
    out: list[Any] = []
    call_id: str | None = None  # the id given to the last assistant function call
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            out.append(message)  # the pipeline refuses it with its own error
            continue
        call = message.get("function_call")
        if message.get("role") == "assistant" and call is not None:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise InvalidRequest(
                    f"`messages[{i}].function_call` must be an object with a `name`.",
                    param=f"messages[{i}].function_call",
                    code="invalid_value",
                )
            call_id = f"call_fn_{i}"
            arguments = call.get("arguments")
            rest = {k: v for k, v in message.items() if k != "function_call"}
            out.append({**rest, "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": call["name"],
                             "arguments": arguments if isinstance(arguments, str) else "{}"},
            }]})  # fmt: skip
        elif message.get("role") == "function":
            rest = {k: v for k, v in message.items() if k not in ("role", "name")}
            out.append({"role": "tool", "tool_call_id": call_id or f"call_fn_{i}", **rest})
        else:
            out.append({k: v for k, v in message.items() if k != "function_call"})
    return out


def to_function_call(completion: dict[str, Any]) -> dict[str, Any]:
    """A whole chat completion in the legacy shape."""
    choices = completion.get("choices")
    if not isinstance(choices, list):
        return completion
    return {**completion, "choices": [_choice(c, "message") for c in choices]}


def _choice(choice: Any, part: str) -> Any:
    if not isinstance(choice, dict):
        return choice
    out = dict(choice)
    message = choice.get(part)
    if isinstance(message, dict) and "tool_calls" in message:
        calls = message["tool_calls"]
        rest = {k: v for k, v in message.items() if k != "tool_calls"}
        first = calls[0] if isinstance(calls, list) and calls else None
        function = first.get("function") if isinstance(first, dict) else None
        if isinstance(function, dict):
            rest["function_call"] = {k: function[k] for k in ("name", "arguments") if k in function}
        out[part] = rest
    if choice.get("finish_reason") == "tool_calls":
        out["finish_reason"] = "function_call"
    return out


async def function_call_events(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A chat stream's events with each chunk in the legacy shape; `[DONE]`, comments and
    events without choices pass as they are."""
    async for event in events:
        chat = ChatEvent.of(event)
        chunks = chat.chunks()
        if not chunks or any(c is DONE for c in chunks) or not _has_calls_or_reason(chunks):
            yield event
            continue
        for chunk in chunks:
            assert isinstance(chunk, dict)
            choices = chunk.get("choices")
            if isinstance(choices, list):
                chunk = {**chunk, "choices": [_choice(c, "delta") for c in choices]}
            yield ChatEvent.parsed_as(data_event(orjson.dumps(chunk)), chunk)


def _has_calls_or_reason(chunks: list[Any]) -> bool:
    """Whether any choice of these chunks carries a tool call or ends with one."""
    for chunk in chunks:
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if choice.get("finish_reason") == "tool_calls" or (
                isinstance(delta, dict) and "tool_calls" in delta
            ):
                return True
    return False
