"""Make engine answers conform to OpenAI's published schemas before clients see them.

vLLM fills optional fields with explicit nulls where OpenAI's schema says "absent or an
object/array" (`message.annotations`, `message.function_call`,
`usage.completion_tokens_details`). Strictly typed clients and contract tests reject
those, so the gateway drops them. Only nulls that the schema forbids are removed; every
other byte of the answer is kept, and an answer that needs no change is passed on as-is.
Streamed chunks from vLLM conform too, except `logprobs` objects, which lack the required
`refusal` key: only streams that asked for logprobs are re-encoded, event by event.

An answer whose fields have shapes no OpenAI answer has (`choices` a number, a message
that is a string, a usage whose counts are not numbers, ...) is not an answer at all: the
engine failed, and the client gets a 502 saying so (in-stream once a stream has begun),
not a 500 from the first line that trusted the shape. Every answer read whole is checked;
of a relayed stream, every chunk the gateway reads (the first, usage and finish chunks,
all of a kept turn's and of a Responses API stream); the chunks it passes on unread are
the engine's bytes, as ever.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.chat.stream import ChatEvent, chunks_of
from gateway.errors import UpstreamError

# Keys OpenAI defines as nullable inside a message: their nulls carry meaning.
_NULLABLE_MESSAGE_KEYS = frozenset({"content", "refusal", "audio"})


def _drop_nulls(obj: dict[str, Any], keep: frozenset[str] = frozenset()) -> bool:
    nulls = [k for k, v in obj.items() if v is None and k not in keep]
    for key in nulls:
        del obj[key]
    return bool(nulls)


class NotAnAnswer(ValueError):
    """An engine's 200 that holds no answer: not a JSON object, or one whose fields have
    the wrong shape."""

    def upstream_error(self) -> UpstreamError:
        """What the client is told: the engine failed (502), and how."""
        return UpstreamError(f"The engine's answer is malformed: {self}.")


_TOKEN_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens", "input_tokens",
                 "output_tokens")  # fmt: skip
_DETAILS = ("prompt_tokens_details", "completion_tokens_details", "input_tokens_details")


def check_shape(data: dict[str, Any], part: str) -> None:
    """Raises NotAnAnswer when a field the gateway reads in a completion (`part`:
    `message`) or a stream chunk (`delta`) has the wrong type; absent and null are fine
    (embeddings and text completions have no messages, a usage chunk no choices). Runs on
    every chunk of a kept turn: plain type tests on what JSON parsing made (a bool is no
    whole number here), and the field's name worked out only for the error."""
    usage = data.get("usage")
    if usage is not None and (problem := _usage_problem(usage)):
        raise NotAnAnswer(problem)
    choices = data.get("choices")
    if choices is None:
        return
    if type(choices) is not list:
        raise NotAnAnswer("`choices` is not a list of objects")
    for i, choice in enumerate(choices):
        if type(choice) is not dict:
            raise NotAnAnswer("`choices` is not a list of objects")
        text = choice.get("text")  # a text completion's
        if text is not None and type(text) is not str:
            raise NotAnAnswer(f"`choices[{i}].text` is not a string")
        inner = choice.get(part)
        if inner is None:
            continue
        if type(inner) is not dict:
            raise NotAnAnswer(f"`choices[{i}].{part}` is not an object")
        content = inner.get("content")
        if content is not None and type(content) is not str:
            raise NotAnAnswer(f"`choices[{i}].{part}.content` is not a string")
        calls = inner.get("tool_calls")
        if calls is not None and (problem := _calls_problem(calls)):
            raise NotAnAnswer(f"`choices[{i}].{part}.tool_calls{problem}")


def _usage_problem(usage: Any) -> str | None:
    if type(usage) is not dict:
        return "`usage` is not an object"
    for name in _TOKEN_COUNTS:
        value = usage.get(name)
        if value is not None and type(value) is not int:
            return f"`usage.{name}` is not a whole number"
    for name in _DETAILS:
        details = usage.get(name)
        if details is None:
            continue
        if type(details) is not dict:
            return f"`usage.{name}` is not an object"
        cached = details.get("cached_tokens")
        if cached is not None and type(cached) is not int:
            return f"`usage.{name}.cached_tokens` is not a whole number"
    return None


def _calls_problem(calls: Any) -> str | None:
    """What is wrong with a message's or delta's `tool_calls`, as the rest of the field's
    name and the complaint (`[0].function` is not an object)."""
    if type(calls) is not list:
        return "` is not a list of objects"
    for j, call in enumerate(calls):
        if type(call) is not dict:
            return "` is not a list of objects"
        index = call.get("index")
        if index is not None and type(index) is not int:
            return f"[{j}].index` is not a whole number"
        for name in ("id", "type"):
            value = call.get(name)
            if value is not None and type(value) is not str:
                return f"[{j}].{name}` is not a string"
        function = call.get("function")
        if function is None:
            continue
        if type(function) is not dict:
            return f"[{j}].function` is not an object"
        for name in ("name", "arguments"):
            value = function.get(name)
            if value is not None and type(value) is not str:
                return f"[{j}].function.{name}` is not a string"
    return None


def conform_response(payload: bytes) -> bytes:
    """Return the payload with schema-breaking nulls removed (the same bytes if none).
    Raises NotAnAnswer when it is not a JSON object (a proxy's HTML page, a cut body) or
    has the wrong shape (`check_shape`)."""
    return conform_completion(payload)[0]


def conform_completion(payload: bytes) -> tuple[bytes, dict[str, Any]]:
    """`conform_response`, and the answer it parsed (as conformed), for whoever reads it
    next: the body is parsed once."""
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise NotAnAnswer(f"not JSON: {payload[:80]!r}") from None
    if not isinstance(body, dict):
        raise NotAnAnswer(f"not a JSON object: {payload[:80]!r}")
    check_shape(body, "message")
    changed = False
    usage = body.get("usage")
    if isinstance(usage, dict):
        changed |= _drop_nulls(usage)
        for details in ("prompt_tokens_details", "completion_tokens_details"):
            if isinstance(usage.get(details), dict):
                changed |= _drop_nulls(usage[details])
    for choice in body.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        if isinstance(message, dict):
            changed |= _drop_nulls(message, keep=_NULLABLE_MESSAGE_KEYS)
        changed |= _complete_logprobs(choice)
    return (orjson.dumps(body) if changed else payload), body


def _complete_logprobs(choice: dict[str, Any]) -> bool:
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict) and "content" in logprobs and "refusal" not in logprobs:
        logprobs["refusal"] = None
        return True
    return False


def conform_event(event: bytes) -> bytes:
    """One SSE event of a chat stream, with its chunk made to conform (the same event if
    it does; a ChatEvent's kept parse is read, not parsed again). Raises NotAnAnswer when
    the chunk has the wrong shape (`check_shape`)."""
    if not event.startswith(b"data: {"):
        return event
    chunks = chunks_of(event)
    if len(chunks) != 1 or not isinstance(chunk := chunks[0], dict):
        return event  # not one JSON object: passed on as the engine sent it
    check_shape(chunk, "delta")
    changed = False
    for choice in chunk.get("choices") or ():
        if isinstance(choice, dict):
            changed |= _complete_logprobs(choice)
    if not changed:
        return event
    body_end = len(event.rstrip(b"\r\n"))
    return ChatEvent.parsed_as(b"data: " + orjson.dumps(chunk) + event[body_end:], chunk)
