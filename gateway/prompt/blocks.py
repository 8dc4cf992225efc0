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
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

_SEPARATOR = b"\x1e"  # keeps "ab"+"c" and "a"+"bc" apart


def prompt_bytes(
    body: dict[str, Any], tools_json: bytes | None = None, messages_json: bytes | None = None
) -> bytes:
    """The parts of a chat or completion request that form the engine's prompt, in order.

    The messages after the system prompt are serialised as one JSON array: a later turn's
    array starts with the earlier turn's bytes (only the closing bracket differs), so
    every whole block before the end is shared. `tools_json` and `messages_json`, when
    given, are the body's tools and messages already serialised by orjson (the
    canonicalizer has the tools; the request keeps its messages for the engine's body).
    """
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[bytes] = []
        system = messages[0] if messages and _is_system(messages[0]) else None
        if system is not None:
            parts.append(orjson.dumps(system.get("content")))
        if tools_json is None and body.get("tools"):
            tools_json = orjson.dumps(body["tools"])
        if tools_json is not None:
            parts.append(tools_json)
        parts.append(_after_system(messages, system, messages_json))
        return _SEPARATOR.join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt.encode()
    if prompt is not None:
        return orjson.dumps(prompt)
    return b""


def _after_system(
    messages: list[Any], system: dict[str, Any] | None, messages_json: bytes | None
) -> bytes:
    """The messages after the system prompt as one JSON array. Cut from `messages_json`
    when given: orjson writes a list as `[` + its items joined by `,` + `]`, so dropping
    the first item's bytes leaves exactly the rest's serialisation."""
    if messages_json is None:
        return orjson.dumps(messages[1:] if system is not None else messages)
    if system is None:
        return messages_json
    if len(messages) == 1:
        return b"[]"
    return b"[" + messages_json[len(orjson.dumps(system)) + 2 :]


def _constants(label: bytes, count: int) -> npt.NDArray[np.uint64]:
    """Fixed odd 64-bit multipliers, derived from a hash rather than a random generator so
    every gateway process and version computes the same ids (the request log and other
    gateway replicas depend on it)."""
    raw = hashlib.shake_256(b"agent-gateway/" + label).digest(8 * count)
    return np.frombuffer(raw, dtype="<u8") | np.uint64(1)


_WORDS_PER_BLOCK: dict[int, npt.NDArray[np.uint64]] = {}
_POSITIONS = _constants(b"positions", 1 << 14)  # 8 MB of prompt at 512-byte blocks
_FOLD = np.uint64(32)


def chain_hashes(data: bytes, block_bytes: int, seed: int = 0) -> tuple[int, ...]:
    """Block i's id: a 64-bit hash of everything up to the end of block i, in the keyspace
    of `seed` (a tenant's cache scope, gateway/tenants/cache_scope.py: equal prompts of two
    isolated tenants get unrelated ids, as they get unrelated blocks in the engine).

    Each block's 64-bit words are folded (x ^ x>>32, so a change in a word's high bytes
    also reaches its low bits) and dotted with fixed odd multipliers; ids are the running
    sum of block hashes times per-position multipliers, so a block's id covers every
    block before it, in order. Vectorised in numpy: a per-block Python loop cost three
    times as much on a 48 KB agent prompt, and this is the hottest code on the routing
    path. A collision costs at most one less-than-ideal routing choice, never a wrong
    answer.
    """
    blocks = len(data) // block_bytes
    if not blocks:
        return ()
    words_per_block = block_bytes // 8
    multipliers = _WORDS_PER_BLOCK.get(block_bytes)
    if multipliers is None:
        multipliers = _WORDS_PER_BLOCK.setdefault(
            block_bytes, _constants(b"words/%d" % block_bytes, words_per_block)
        )
    positions = _POSITIONS
    if blocks > len(positions):
        positions = _constants(b"positions", blocks)
    words = np.frombuffer(data, dtype="<u8", count=blocks * words_per_block)
    words = words.reshape(blocks, words_per_block)
    per_block = (words ^ (words >> _FOLD)) @ multipliers
    chained = np.cumsum(per_block * positions[:blocks])
    if seed:
        chained += np.uint64(seed)  # wraps modulo 2**64, like the sums before it
    ids: list[int] = chained.tolist()
    return tuple(ids)


def request_blocks(
    body: dict[str, Any],
    block_bytes: int,
    tools_json: bytes | None = None,
    messages_json: bytes | None = None,
    seed: int = 0,
) -> tuple[int, ...]:
    return chain_hashes(prompt_bytes(body, tools_json, messages_json), block_bytes, seed)


def conversation_key(body: dict[str, Any], blocks: tuple[int, ...]) -> str | None:
    """A conversation's identity when the client names no session: its first block and
    its first message after the system prompt, which every later turn resends unchanged.
    Without it, the turns of a new conversation (whose history still fits inside the
    trailing partial block) look alike on every replica and may scatter. Collisions only
    keep two conversations on the same replica, subject to load like any session."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not blocks:
        return None
    start = 1 if messages and _is_system(messages[0]) else 0
    if len(messages) <= start:
        return None
    return f"conv:{blocks[0] & 0xFFFFFFFF:08x}{zlib.crc32(_digest_bytes(messages[start])):08x}"


_CLIENT_KEY_CHARS = 200  # a longer key is not a conversation id anyone sends


def client_conversation(body: dict[str, Any]) -> str | None:
    """The conversation an agent names itself, without any header of ours: the OpenAI
    `prompt_cache_key` (Codex CLI sends its session id there on every request; the
    Chat Completions and Responses APIs both take it). Prefixed so that it never equals
    an X-Session-Id."""
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and 0 < len(key) <= _CLIENT_KEY_CHARS:
        return f"pck:{key}"
    return None


_DIGEST_CHARS = 1024


def _digest_bytes(message: Any) -> bytes:
    """What identifies a message, read in bounded time: a long text is represented by its
    length and its first and last `_DIGEST_CHARS` characters (a 200,000-character
    prompt cost 160 us to serialise and checksum whole, on every turn)."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str) or len(content) <= 2 * _DIGEST_CHARS:
        return orjson.dumps(message)
    ends = f"{len(content)}:{content[:_DIGEST_CHARS]}{content[-_DIGEST_CHARS:]}"
    return orjson.dumps({**message, "content": ends})


def _is_system(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") in ("system", "developer")
