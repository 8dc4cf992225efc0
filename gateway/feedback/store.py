"""Feedback: what a client says about an answer, as Langfuse and LangSmith take it (a request
id, a score, the name of the score, a comment), stored per tenant.

    POST /v1/feedback  {"request_id": "...", "score": 0.8, "name": "user", "comment": "..."}

The request id is the one the gateway answered with (`X-Request-Id`). Each tenant's
feedback goes into its own stream (`agw:feedback:{<tenant>}`, trimmed to `MAX_ENTRIES`),
so a tenant can only ever label its own traffic: feedback naming another tenant's request
id joins nothing when the log is exported, and nothing says whether such a request exists.
The body is data: every field is checked, bounded and stored as text.

A tenant's feedback is stored conversation too: 100,000 entries of 4,000 characters can
hold over a gigabyte, more than the shipped Redis's `maxmemory`. So one script adds an
entry, trims the oldest past `MAX_ENTRIES`, and keeps the stream's bytes beside it
(`agw:feedback:{<tenant>}:bytes`, in the same slot), which count against the tenant's
`limits.stored_bytes` (gateway/state/stored_bytes.py) for as long as the stream is kept
(it does not expire); feedback past the cap gets 429 `stored_bytes_exceeded`. A stream
kept before its count existed is sized at its next entry, from a sample (see `ADD`).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis

from gateway.errors import InvalidRequest, StateUnavailable
from gateway.state.keys import feedback_key
from gateway.state.redis_client import RedisClient
from gateway.state.stored_bytes import StoredBytes
from gateway.untrusted.client_text import check_label

MAX_ENTRIES = 100_000
MAX_COMMENT_CHARS = 4000
KEPT_S = 10 * 365 * 86_400  # the stream does not expire: counted as kept for ten years
SAMPLED = 16  # oldest and newest entries read to size a stream kept before its count

# KEYS: the stream, its bytes. ARGV: the entry's bytes (its fields' and values' lengths),
# the most entries kept, then the fields and values. The entry's id and the stream's bytes,
# the oldest entries past the most (and their bytes) removed. A stream kept before its
# byte count existed is first counted as its length times the mean of its `SAMPLED` oldest
# and newest entries (reading a stream of 100,000 whole would hold Redis for every tenant);
# an estimate that trimming then corrects, and that never counts below nothing.
ADD = """
if redis.call('EXISTS', KEYS[2]) == 0 then
  local length = redis.call('XLEN', KEYS[1])
  if length > 0 then
    local size, seen = 0, 0
    for _, entries in ipairs({
      redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[3]),
      redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[3]),
    }) do
      for _, entry in ipairs(entries) do
        for _, part in ipairs(entry[2]) do size = size + #part end
        seen = seen + 1
      end
    end
    redis.call('SET', KEYS[2], math.floor(size / seen * length))
  end
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
local total = redis.call('INCRBY', KEYS[2], ARGV[1])
local most = tonumber(ARGV[2])
while redis.call('XLEN', KEYS[1]) > most do
  local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1]
  local size = 0
  for _, part in ipairs(oldest[2]) do size = size + #part end
  redis.call('XDEL', KEYS[1], oldest[1])
  total = redis.call('INCRBY', KEYS[2], -size)
end
if total < 0 then
  total = 0
  redis.call('SET', KEYS[2], 0)
end
return {id, total}
"""
# The request ids the edge accepts from a client or makes itself (gateway/edge/middleware.py).
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/=+-]{1,128}")
_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_FIELDS = frozenset({"request_id", "score", "name", "comment"})


@dataclass(frozen=True)
class Feedback:
    request_id: str
    score: float
    name: str = "user"
    comment: str | None = None

    @classmethod
    def parse(cls, body: bytes) -> Feedback:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(
                f"The body must be a JSON object; it is not valid JSON ({exc}).",
                code="invalid_json",
            ) from None
        if not isinstance(data, dict):
            raise InvalidRequest("The body must be a JSON object.", code="invalid_json")
        if unknown := sorted(set(data) - _FIELDS):
            raise InvalidRequest(
                f"Unknown field `{unknown[0]}`: feedback takes request_id, score, name and "
                "comment.",
                param=unknown[0],
            )
        return cls(
            _request_id(data.get("request_id")),
            _score(data.get("score")),
            _name(data.get("name", "user")),
            _comment(data.get("comment")),
        )

    def public(self, feedback_id: str) -> dict[str, Any]:
        return {
            "object": "feedback",
            "id": feedback_id,
            "request_id": self.request_id,
            "name": self.name,
            "score": self.score,
            "comment": self.comment,
        }


def _request_id(value: Any) -> str:
    if not isinstance(value, str) or not _REQUEST_ID.fullmatch(value):
        raise InvalidRequest(
            "`request_id` must be the X-Request-Id the gateway answered with (1-128 "
            "letters, digits and ._:/=+-).",
            param="request_id",
        )
    return value


def _score(value: Any) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest("`score` must be a finite number or a boolean.", param="score")
    return float(value)


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidRequest(
            "`name` must be 1-64 letters, digits and ._:- (the score's name, e.g. `user`).",
            param="name",
        )
    return value


def _comment(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_COMMENT_CHARS:
        raise InvalidRequest(
            f"`comment` must be a string of at most {MAX_COMMENT_CHARS} characters.",
            param="comment",
        )
    return check_label(value, param="comment")


class FeedbackStore:
    def __init__(self, redis: RedisClient, *, max_entries: int = MAX_ENTRIES) -> None:
        self._redis = redis
        self._max_entries = max_entries
        self._add = redis.register_script(ADD)

    async def add(
        self, tenant: str, feedback: Feedback, *, stored: StoredBytes | None = None
    ) -> str:
        """The stored entry's id (the stream's: time-ordered). `stored`: the tenant's
        stored bytes, checked before and counted after."""
        if stored is not None:
            await stored.admit(tenant)
        fields = {
            "request_id": feedback.request_id,
            "score": repr(feedback.score),
            "name": feedback.name,
            "at": f"{time.time():.3f}",
        }
        if feedback.comment is not None:
            fields["comment"] = feedback.comment
        flat = [part.encode() for pair in fields.items() for part in pair]
        key = feedback_key(tenant)
        try:
            entry, total = await self._add(
                keys=[key, f"{key}:bytes"],
                args=[sum(map(len, flat)), self._max_entries, SAMPLED, *flat],
            )
        except (aioredis.RedisError, OSError) as exc:
            raise StateUnavailable(
                f"The feedback store is unreachable ({type(exc).__name__})."
            ) from None
        if stored is not None:
            await stored.put(tenant, "f", "feedback", int(total), ttl_s=KEPT_S)
        return _text(entry)

    async def read(self, tenant: str, *, count: int = MAX_ENTRIES) -> list[dict[str, str]]:
        """The tenant's feedback, oldest first (for `gateway dataset export`)."""
        entries = await self._redis.xrange(feedback_key(tenant), count=count) or []
        return [
            {_text(k): _text(v) for k, v in (fields or {}).items()} | {"id": _text(entry_id)}
            for entry_id, fields in entries
        ]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
