"""`POST /v1/responses/compact` on the gateway's own trimming (gateway/trimming/trim.py), not
a model's summary: the conversation's earlier turns folded into one block (every user
message verbatim, entity states as validated JSON Patches, a fetchable stub for each other
tool result), the recent tail kept as it is.

The compacted conversation is kept in Redis and the client gets a `compaction` item whose
`encrypted_content` names it (`agw-compaction-v1:<id>`, 128 random bits, the caller's
tenant only): nothing is encrypted, the content never leaves the gateway. A later request
that carries the item has it replaced by the compacted messages (`hydrate`), byte for byte
the same each time, so from the second turn after compaction on the engine's prefix cache
holds the whole compacted block. An item the gateway does not know (expired with the
session TTL, another tenant's, another provider's) is a 400 naming it.

Compaction asks no engine: it costs the gateway a render and one Redis write.

The same compaction runs inside `POST /v1/responses` when the request's
`context_management` asks for it and the conversation's rendered tokens cross its
`compact_threshold` (`compact_past`): the engine is sent the compacted conversation and
the response's output starts with the compaction item, as OpenAI's server-side compaction
answers.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson
import redis.asyncio as aioredis

from gateway.chat.messages import Message
from gateway.errors import InvalidRequest, StateUnavailable
from gateway.policy.sessions import TrimmingSpec
from gateway.state.keys import compaction_key
from gateway.state.redis_client import RedisClient
from gateway.state.stored_bytes import StoredBytes
from gateway.trimming.tokens import TokenCounter
from gateway.trimming.trim import Trimmed, Trimmer

PREFIX = "agw-compaction-v1:"


class Compactions:
    def __init__(
        self, redis: RedisClient, *, ttl_s: int, stored: StoredBytes | None = None
    ) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        self._stored = stored  # counted against the tenant's `limits.stored_bytes`

    async def put(self, tenant: str, messages: list[Message]) -> str:
        """Keeps the compacted messages; returns the item's `encrypted_content`."""
        if self._stored is not None:
            await self._stored.admit(tenant)
        ident = secrets.token_hex(16)
        kept = orjson.dumps(messages)
        try:
            await self._redis.set(compaction_key(tenant, ident), kept, ex=self._ttl_s)
        except (aioredis.RedisError, OSError) as exc:
            raise StateUnavailable(f"The compaction store is unreachable ({exc}).") from None
        if self._stored is not None:
            await self._stored.put(tenant, "c", ident, len(kept))
        return PREFIX + ident

    async def hydrate(self, items: Any, tenant: str) -> dict[int, list[Message]]:
        """The messages each `compaction` item of the input stands for, by its index."""
        found: dict[int, list[Message]] = {}
        if not isinstance(items, list):
            return found
        for index, item in enumerate(items):
            if not isinstance(item, dict) or item.get("type") != "compaction":
                continue
            param = f"input[{index}].encrypted_content"
            if not made_here(item.get("encrypted_content")):
                raise InvalidRequest(
                    "This compaction item was not made by this gateway.", param=param
                )
            messages = await self.find(tenant, item["encrypted_content"])
            if messages is None:
                raise InvalidRequest(
                    "This compaction item is unknown or has expired; send the conversation whole.",
                    param=param,
                    code="compaction_not_found",
                )
            found[index] = messages
        return found

    async def find(self, tenant: str, content: str) -> list[Message] | None:
        """The compacted messages an item's `encrypted_content` names (`made_here`), or
        None when they are unknown to this tenant or have expired."""
        try:
            raw = await self._redis.get(compaction_key(tenant, content[len(PREFIX) :]))
        except (aioredis.RedisError, OSError) as exc:
            raise StateUnavailable(f"The compaction store is unreachable ({exc}).") from None
        if raw is None:
            return None
        messages: list[Message] = orjson.loads(raw)
        return messages


def made_here(content: Any) -> bool:
    """An `encrypted_content` of the form `Compactions.put` returns."""
    if not isinstance(content, str) or not content.startswith(PREFIX):
        return False
    ident = content[len(PREFIX) :]
    return len(ident) == 32 and all(c in "0123456789abcdef" for c in ident)


def compact_past(
    messages: list[Message], threshold: int, spec: TrimmingSpec, tokens: TokenCounter
) -> Trimmed | None:
    """Server-side compaction (a request's `context_management`): the conversation
    compacted when its rendered tokens (instructions included, counted by the trimming
    tokenizer) cross `threshold`; None when they do not. The tail kept is the policy's
    low-water mark or half the threshold, whichever is smaller: a client that asks for
    compaction past 1,000 tokens is not sent a 2,500-token tail."""
    if Trimmer(spec, tokens).rendered_tokens(messages) <= threshold:
        return None
    tail = min(spec.low_water_tokens, max(64, threshold // 2))
    return compact(messages, spec.model_copy(update={"low_water_tokens": tail}), tokens)


def compact(messages: list[Message], spec: TrimmingSpec, tokens: TokenCounter) -> Trimmed:
    """The conversation with everything but a tail under the low-water mark (the policy's
    or the tenant's) folded into the block, whatever the high-water mark says; as it is
    when it is under the low-water mark already."""
    # `model_copy` does not validate: a high-water mark of 0 means "compact now" (and no
    # budget may raise it: the client asked for the compaction)
    now = spec.model_copy(update={"enabled": True, "high_water_tokens": 0, "budget": None})
    trimmer = Trimmer(now, tokens)
    tokens_now = trimmer.history_tokens(messages)
    if tokens_now <= spec.low_water_tokens:
        return Trimmed(list(messages), 0, tokens_now)
    return trimmer.trim(messages, 0, to_send=False)


def compaction_item(content: str) -> dict[str, Any]:
    """The item that stands for a kept compacted conversation (`Compactions.put`)."""
    return {"type": "compaction", "id": f"cmp_{content[-32:]}", "encrypted_content": content}


def compact_threshold(entries: Any, default: int) -> int | None:
    """The token threshold a request's `context_management` sets for compaction (the
    smallest its entries name; `default` for `compact_threshold: null`); None when it asks
    for no compaction. Any other entry is refused: dropped, what it asks for would
    silently not happen."""
    if entries is None:
        return None
    if not isinstance(entries, list) or not entries:
        raise InvalidRequest(
            "`context_management` must be a non-empty list of entries.",
            param="context_management",
            code="invalid_type",
        )
    thresholds = []
    for i, entry in enumerate(entries):
        param = f"context_management[{i}]"
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind != "compaction":
            raise InvalidRequest(
                "The only context management entry is `{type: compaction, compact_threshold}`.",
                param=f"{param}.type",
                code="unsupported_value",
            )
        value = entry.get("compact_threshold")
        if value is not None and (type(value) is not int or value < 1000):
            raise InvalidRequest(
                "`compact_threshold` must be an integer of at least 1000, or null.",
                param=f"{param}.compact_threshold",
                code="invalid_value",
            )
        thresholds.append(default if value is None else value)
    return min(thresholds)
