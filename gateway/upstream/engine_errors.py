"""An engine's error reply, as one of the gateway's errors (gateway/errors.py): its message
kept, its 4xx the client's to fix, anything else the engine failing. vLLM's refusal of a
prompt its window cannot hold is recognised from its words (it sends no code for it) and
becomes `ContextLengthExceeded`, which agents act on.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.errors import ContextLengthExceeded, GatewayError, UpstreamError, UpstreamRejected

# vLLM's words for a prompt its window cannot hold, this version's and earlier ones'. Read
# from the first `_READ_CHARS` of the message only: an engine's message is data too.
_CONTEXT_ERRORS = tuple(
    re.compile(pattern)
    for pattern in (
        # the prompt alone, counted in tokens (one past the window at most: "at least")
        r"maximum context length is (?P<limit>\d+) tokens\. However, your prompt contains "
        r"(?:at least )?(?P<input>\d+) input tokens",
        # the prompt alone, too many characters to be counted
        r"maximum context length is (?P<limit>\d+) tokens\. However, your prompt contains "
        r"\d+ characters",
        r"Input length \((?P<input>\d+)\) exceeds model's maximum context length "
        r"\((?P<limit>\d+)\)",
        # prompt and completion together (vLLM before it capped the completion itself)
        r"maximum context length is (?P<limit>\d+) tokens\. However, you requested \d+ "
        r"tokens \((?P<input>\d+) in the messages, (?P<output>\d+) in the completion\)",
        r"maximum context length of (?P<limit>\d+) tokens\. You requested a total of \d+ "
        r"tokens: (?P<input>\d+) tokens from the input messages and (?P<output>\d+) tokens "
        r"for the completion",
    )
)
_READ_CHARS = 1000


def context_length_error(message: str) -> ContextLengthExceeded | None:
    """vLLM's refusal of a prompt longer than its window, recognised; None for any other."""
    head = message[:_READ_CHARS]
    for pattern in _CONTEXT_ERRORS:
        found = pattern.search(head)
        if found is None:
            continue
        named = found.groupdict()
        limit = int(named["limit"])
        counted = named.get("input")
        output = named.get("output")
        return ContextLengthExceeded(
            message,
            limit=limit,
            input_tokens=int(counted) if counted is not None else limit + 1,
            output_tokens=int(output) if output is not None else None,
        )
    return None


def upstream_error_from_body(status: int, raw: bytes) -> GatewayError:
    """Turn an engine's error reply into ours, keeping its message.

    vLLM has answered both `{"error": {...}}` and the older flat
    `{"object": "error", "message": ..., "type": ..., "code": ...}`; accept either.
    """
    message = f"engine answered HTTP {status}"
    param: str | None = None
    code: str | None = None
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        nested = parsed.get("error")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else parsed
        if isinstance(inner.get("message"), str):
            message = inner["message"]
        if isinstance(inner.get("param"), str):
            param = inner["param"]
        if isinstance(inner.get("code"), str):
            code = inner["code"]
    elif raw:
        message = f"{message}: {raw[:200].decode('utf-8', 'replace')}"
    if status == 400 and (too_long := context_length_error(message)) is not None:
        return too_long
    if 400 <= status < 500 and status != 429:
        return UpstreamRejected(status, message, param=param, code=code)
    return UpstreamError(f"engine failed (HTTP {status}): {message}")
