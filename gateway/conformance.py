"""Make engine answers conform to OpenAI's published schemas before clients see them.

vLLM fills optional fields with explicit nulls where OpenAI's schema says "absent or an
object/array" (`message.annotations`, `message.function_call`,
`usage.completion_tokens_details`). Strictly typed clients and contract tests reject
those, so the gateway drops them. Only nulls that the schema forbids are removed; every
other byte of the answer is kept, and an answer that needs no change is passed on as-is.
Streamed chunks from vLLM conform too, except `logprobs` objects, which lack the required
`refusal` key: only streams that asked for logprobs are re-encoded, event by event.
"""

from __future__ import annotations

from typing import Any

import orjson

# Keys OpenAI defines as nullable inside a message: their nulls carry meaning.
_NULLABLE_MESSAGE_KEYS = frozenset({"content", "refusal", "audio"})


def _drop_nulls(obj: dict[str, Any], keep: frozenset[str] = frozenset()) -> bool:
    nulls = [k for k, v in obj.items() if v is None and k not in keep]
    for key in nulls:
        del obj[key]
    return bool(nulls)


class NotAnAnswer(ValueError):
    """An engine's 200 whose body is not a JSON object: no answer at all."""


def conform_response(payload: bytes) -> bytes:
    """Return the payload with schema-breaking nulls removed (the same bytes if none).
    Raises NotAnAnswer when it is not a JSON object (a proxy's HTML page, a cut body)."""
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise NotAnAnswer(f"not JSON: {payload[:80]!r}") from None
    if not isinstance(body, dict):
        raise NotAnAnswer(f"not a JSON object: {payload[:80]!r}")
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
    return orjson.dumps(body) if changed else payload


def _complete_logprobs(choice: dict[str, Any]) -> bool:
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict) and "content" in logprobs and "refusal" not in logprobs:
        logprobs["refusal"] = None
        return True
    return False


def conform_event(event: bytes) -> bytes:
    """One SSE event of a chat stream, with its chunk made to conform (same bytes if it does)."""
    if not event.startswith(b"data: {"):
        return event
    body_end = len(event.rstrip(b"\r\n"))
    try:
        chunk = orjson.loads(event[6:body_end])
    except orjson.JSONDecodeError:
        return event
    changed = False
    for choice in chunk.get("choices") or ():
        if isinstance(choice, dict):
            changed |= _complete_logprobs(choice)
    return b"data: " + orjson.dumps(chunk) + event[body_end:] if changed else event
