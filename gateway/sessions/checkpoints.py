"""One checkpoint per completed turn, and how a session's history is folded from them.

A checkpoint stores what the turn *added*, not the whole conversation again: the client's
new messages (or, when the client rewrote its history, all of it, marked `rewrite`), the
assistant's reply, and what the engine received besides the history (tool sets are kept
once per session by digest). Folding the checkpoints in order gives the conversation at
any turn, and the exact request the engine saw at turn n is rebuilt from it; where the
engine's messages differ from the conversation (a canonicalizer moved volatile values), the
checkpoint holds the engine's messages whole. So a 32 KB session costs about 32 KB of
Redis, not the sum of every turn's context.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import orjson

from gateway.chat.messages import Message


@dataclass(frozen=True)
class Checkpoint:
    created_at: float
    request_id: str
    model: str
    mode: Literal["full", "delta"]  # what the client sent: its whole history, or what is new
    new_messages: list[Message]
    rewrite: bool  # the client's history did not extend the stored one: new_messages is all
    reply: Message | None
    engine: dict[str, Any]  # the engine request without `messages`; tools as {"$blob": digest}
    engine_messages: list[Message] | None = None  # only when they differ from the history
    route: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    entities: dict[str, Any] = field(default_factory=dict)
    trim_boundary: int = 0  # where the kept tail started (gateway/trimming/trim.py)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> Checkpoint:
        data = orjson.loads(raw)
        return cls(**data)


def history(checkpoints: Sequence[Checkpoint], *, with_last_reply: bool = True) -> list[Message]:
    """The conversation after these turns: every turn's new messages and reply, in order."""
    messages = Stored().then(checkpoints).messages
    if not with_last_reply and checkpoints and checkpoints[-1].reply is not None:
        messages.pop()  # the last turn's reply is the last message
    return messages


@dataclass(frozen=True)
class Stored:
    """What a request needs of its session's earlier turns, folded: the conversation (every
    turn's new messages and reply), the declared entities' latest states, and where the
    last turn's trimmed tail began. Loaded from a snapshot of the first turns plus the
    turns after it (sessions/store.py), so a long session is not read turn by turn."""

    turns: int = 0
    messages: list[Message] = field(default_factory=list)
    entities: dict[str, Any] = field(default_factory=dict)
    trim_boundary: int = 0
    last_request_id: str = ""  # the last turn's (a Responses API continuation checks it)

    def then(self, checkpoints: Sequence[Checkpoint]) -> Stored:
        """This, followed by these turns (a rewrite starts the conversation afresh)."""
        if not checkpoints:
            return self
        messages, entities = list(self.messages), dict(self.entities)
        for checkpoint in checkpoints:
            if checkpoint.rewrite:
                messages = list(checkpoint.new_messages)
            else:
                messages.extend(checkpoint.new_messages)
            if checkpoint.reply is not None:
                messages.append(checkpoint.reply)
            entities.update(checkpoint.entities)
        last = checkpoints[-1]
        turns = self.turns + len(checkpoints)
        return Stored(turns, messages, entities, last.trim_boundary, last.request_id)

    def snapshot(self) -> bytes:
        """`<turns>\\n<JSON>`: the turn count first, which a Redis script reads."""
        body = {"messages": self.messages, "entities": self.entities,
                "trim_boundary": self.trim_boundary,
                "last_request_id": self.last_request_id}  # fmt: skip
        return b"%d\n" % self.turns + orjson.dumps(body)

    @classmethod
    def from_snapshot(cls, raw: bytes) -> Stored:
        turns, _, body = raw.partition(b"\n")
        data = orjson.loads(body)
        return cls(
            int(turns),
            data["messages"],
            data["entities"],
            data["trim_boundary"],
            data.get("last_request_id", ""),
        )


def new_messages(stored: list[Message], sent: list[Message]) -> tuple[list[Message], bool]:
    """What a client that resends its whole history added this turn: the part after the
    stored conversation, or everything (a rewrite) when the stored part was changed."""
    if len(sent) >= len(stored) and sent[: len(stored)] == stored:
        return sent[len(stored) :], False
    return list(sent), True


def split_engine_request(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The engine request without messages, tools replaced by their digest; and the blobs."""
    engine = {k: v for k, v in body.items() if k != "messages"}
    blobs: dict[str, bytes] = {}
    tools = engine.get("tools")
    if tools:
        raw = orjson.dumps(tools)
        key = hashlib.blake2b(raw, digest_size=12).hexdigest()
        blobs[key] = raw
        engine["tools"] = {"$blob": key}
    return engine, blobs


def engine_request(
    checkpoints: Sequence[Checkpoint], turn: int, blobs: dict[str, bytes]
) -> dict[str, Any]:
    """Exactly what the engine was sent at `turn` (1-based)."""
    checkpoint = checkpoints[turn - 1]
    messages = checkpoint.engine_messages
    if messages is None:
        messages = history(checkpoints[:turn], with_last_reply=False)
    body = dict(checkpoint.engine)
    tools = body.get("tools")
    if isinstance(tools, dict) and "$blob" in tools:
        raw = blobs.get(tools["$blob"])
        body["tools"] = orjson.loads(raw) if raw is not None else None
    body["messages"] = messages
    return body
