"""Feedback: what a client says about an answer, as Langfuse and LangSmith take it (a request
id, a score, the name of the score, a comment), stored per tenant.

    POST /v1/feedback  {"request_id": "...", "score": 0.8, "name": "user", "comment": "..."}

The request id is the one the gateway answered with (`X-Request-Id`). Each tenant's
feedback goes into its own stream (`agw:feedback:{<tenant>}`, trimmed to about
`MAX_ENTRIES`), so a tenant can only ever label its own traffic: feedback naming another
tenant's request id joins nothing when the log is exported, and nothing says whether such a
request exists. The body is data: every field is checked, bounded and stored as text.
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
from gateway.untrusted.client_text import check_label

MAX_ENTRIES = 100_000
MAX_COMMENT_CHARS = 4000
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
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def add(self, tenant: str, feedback: Feedback) -> str:
        """The stored entry's id (the stream's: time-ordered)."""
        fields = {
            "request_id": feedback.request_id,
            "score": repr(feedback.score),
            "name": feedback.name,
            "at": f"{time.time():.3f}",
        }
        if feedback.comment is not None:
            fields["comment"] = feedback.comment
        try:
            entry = await self._redis.xadd(
                feedback_key(tenant),
                fields,  # type: ignore[arg-type]
                maxlen=MAX_ENTRIES,
                approximate=True,
            )
        except (aioredis.RedisError, OSError) as exc:
            raise StateUnavailable(
                f"The feedback store is unreachable ({type(exc).__name__})."
            ) from None
        return entry.decode() if isinstance(entry, bytes) else str(entry)

    async def read(self, tenant: str, *, count: int = MAX_ENTRIES) -> list[dict[str, str]]:
        """The tenant's feedback, oldest first (for `gateway dataset export`)."""
        entries = await self._redis.xrange(feedback_key(tenant), count=count) or []
        return [
            {_text(k): _text(v) for k, v in (fields or {}).items()} | {"id": _text(entry_id)}
            for entry_id, fields in entries
        ]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
