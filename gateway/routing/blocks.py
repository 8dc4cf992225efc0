"""A request's prompt prefix as a chain of block hashes.

vLLM caches KV in fixed-size token blocks and reuses a block only when every token before
it matches too, so a prefix is identified by chained hashes: block i's hash covers block i
and, through block i-1's hash, everything before it. The gateway does not tokenise; it
cuts the prompt's canonical bytes into `block_bytes` pieces in the order the chat template
renders them (first system message, then tools, then the other messages). Equal prefixes
give equal leading hashes, and only whole blocks count, as in the engine.
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson

_SEPARATOR = b"\x1e"  # keeps "ab"+"c" and "a"+"bc" apart


def prompt_bytes(body: dict[str, Any]) -> bytes:
    """The parts of a chat or completion request that form the engine's prompt, in order.

    The messages after the system prompt are serialised as one JSON array: a later turn's
    array starts with the earlier turn's bytes (only the closing bracket differs), so
    every whole block before the end is shared.
    """
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[bytes] = []
        rest = messages
        first = messages[0] if messages else None
        if isinstance(first, dict) and first.get("role") in ("system", "developer"):
            parts.append(orjson.dumps(first.get("content")))
            rest = messages[1:]
        tools = body.get("tools")
        if tools:
            parts.append(orjson.dumps(tools))  # already canonical when canonicalisation is on
        parts.append(orjson.dumps(rest))
        return _SEPARATOR.join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt.encode()
    if prompt is not None:
        return orjson.dumps(prompt)
    return b""


def chain_hashes(data: bytes, block_bytes: int) -> tuple[int, ...]:
    """Block i's id: the CRC-32 of everything up to the end of block i, computed
    incrementally so each byte is read once. A collision costs at most one
    less-than-ideal routing choice, never a wrong answer. (This loop is the hottest
    code on the routing path: keep it to one C call per block.)"""
    crc32 = zlib.crc32
    hashes: list[int] = []
    append = hashes.append
    crc = 0
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        crc = crc32(data[start : start + block_bytes], crc)
        append(crc)
    return tuple(hashes)


def request_blocks(body: dict[str, Any], block_bytes: int) -> tuple[int, ...]:
    return chain_hashes(prompt_bytes(body), block_bytes)
