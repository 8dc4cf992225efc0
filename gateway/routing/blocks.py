"""A request's prompt prefix as a chain of block hashes.

vLLM caches KV in fixed-size token blocks and reuses a block only when every token before
it matches too, so a prefix is identified by chained hashes: block i's hash covers block i
and, through block i-1's hash, everything before it. The gateway does not tokenise; it
cuts the prompt's canonical bytes into `block_bytes` pieces in the order the chat template
renders them (first system message, then tools, then the other messages). Equal prefixes
give equal leading hashes, and only whole blocks count, as in the engine.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

_SEPARATOR = b"\x1e"  # keeps "ab"+"c" and "a"+"bc" apart


def prompt_bytes(body: dict[str, Any]) -> bytes:
    """The parts of a chat or completion request that form the engine's prompt, in order."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[bytes] = []
        rest = messages
        if (
            messages
            and isinstance(messages[0], dict)
            and messages[0].get("role") in ("system", "developer")
        ):
            parts.append(orjson.dumps(messages[0].get("content"), option=orjson.OPT_SORT_KEYS))
            rest = messages[1:]
        tools = body.get("tools")
        if tools:
            parts.append(orjson.dumps(tools))  # already canonical when canonicalisation is on
        parts.extend(orjson.dumps(m, option=orjson.OPT_SORT_KEYS) for m in rest)
        return _SEPARATOR.join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt.encode()
    if prompt is not None:
        return orjson.dumps(prompt)
    return b""


def chain_hashes(data: bytes, block_bytes: int) -> tuple[int, ...]:
    hashes: list[int] = []
    previous = b""
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        digest = hashlib.blake2b(
            previous + data[start : start + block_bytes], digest_size=8
        ).digest()
        hashes.append(int.from_bytes(digest, "big"))
        previous = digest
    return tuple(hashes)


def request_blocks(body: dict[str, Any], block_bytes: int) -> tuple[int, ...]:
    return chain_hashes(prompt_bytes(body), block_bytes)
