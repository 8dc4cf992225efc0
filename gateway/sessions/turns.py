"""A request's turn in its session: hydrate before routing, checkpoint after the reply.

`begin` refuses a turn (StoredBytesExceeded) once the tenant's stored conversations hold
its `limits.stored_bytes`, then reads the session's checkpoints. With `X-Context-Mode:
delta` the client sent only what is new and the stored conversation is put in front of it;
otherwise the client resent its history and only what it added is kept. `commit` appends
the completed turn; it is called before the client sees the end of the answer (`data:
[DONE]`), and never for a turn that failed, which leaves the previous checkpoint as it
was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from gateway.chat.messages import Message
from gateway.chat.replies import normalise
from gateway.errors import InvalidRequest
from gateway.sessions.checkpoints import Checkpoint, Stored, new_messages, split_engine_request
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import CheckpointStore
from gateway.state.stored_bytes import StoredBytes
from gateway.trimming.conversation import latest_states
from gateway.trimming.trim import Trimmed, Trimmer

ContextMode = Literal["full", "delta"]


def context_mode(header: str | None) -> ContextMode:
    if header is None or header == "" or header.lower() == "full":
        return "full"
    if header.lower() == "delta":
        return "delta"
    raise InvalidRequest(
        "X-Context-Mode must be `full` (the default) or `delta`.",
        param="X-Context-Mode",
        code="invalid_context_mode",
    )


@dataclass(frozen=True)
class Turn:
    session: SessionRef
    mode: ContextMode
    prior: Stored  # the session's earlier turns, folded
    new_messages: list[Message]
    rewrite: bool
    conversation: list[Message]  # the whole conversation this turn continues, new messages in
    trimmed: Trimmed | None = None  # what trimming made of the context, when it is on


class SessionTurns:
    def __init__(
        self,
        store: CheckpointStore,
        trimmer: Trimmer | None = None,
        tenant_trimmers: Mapping[str, Trimmer | None] | None = None,
        stored: StoredBytes | None = None,
    ) -> None:
        """`tenant_trimmers`: the tenants whose trimming differs from `trimmer`'s (off:
        None), by name (gateway/trimming/per_tenant.py). `stored`: what each tenant's
        conversations may still hold."""
        self.store = store
        self._stored = stored
        self.trimmer = trimmer
        self._tenant_trimmers = tenant_trimmers or {}

    def trimmer_of(self, tenant: str) -> Trimmer | None:
        return self._tenant_trimmers.get(tenant, self.trimmer)

    async def begin(
        self,
        session: SessionRef,
        mode: ContextMode,
        body: dict[str, Any],
        *,
        engine_context: Callable[[], int | None] | None = None,
    ) -> tuple[Turn, dict[str, Any]]:
        """The turn, and the body to send on (the whole conversation, in delta mode).
        `engine_context`: the engines' context window, for a trimming budget that sets
        none of its own."""
        if self._stored is not None:
            await self._stored.admit(session.tenant)
        prior = await self.store.load_stored(session)
        stored = prior.messages
        sent = [normalise(m) for m in body.get("messages") or ()]
        if mode == "delta":
            body = {**body, "messages": [*stored, *body.get("messages", ())]}
            turn = Turn(session, mode, prior, sent, False, [*stored, *sent])
        else:
            added, rewrite = new_messages(stored, sent)
            conversation = added if rewrite else [*stored, *added]
            turn = Turn(session, mode, prior, added, rewrite, conversation)
        trimmer = self.trimmer_of(session.tenant)
        if trimmer is None:
            return turn, body
        # A rewritten history invalidates the old boundary: compaction starts afresh.
        boundary = prior.trim_boundary if prior.turns and not turn.rewrite else 0
        engine_tokens = None
        if engine_context is not None and trimmer.follows_engine:
            engine_tokens = engine_context()
        trimmed = trimmer.trim(list(body["messages"]), boundary, engine_context=engine_tokens)
        return replace(turn, trimmed=trimmed), {**body, "messages": trimmed.messages}

    async def commit(
        self,
        turn: Turn,
        *,
        engine_body: dict[str, Any],
        reply: Message | None,
        usage: dict[str, Any] | None,
        route: dict[str, Any],
        request_id: str,
        model: str,
    ) -> int:
        engine, blobs = split_engine_request(engine_body)
        entities = self._changed_entities(turn, reply)
        checkpoint = Checkpoint(
            created_at=round(time.time(), 3),
            request_id=request_id,
            model=model,
            mode=turn.mode,
            new_messages=turn.new_messages,
            rewrite=turn.rewrite,
            reply=reply,
            engine=engine,
            route=route,
            usage=usage,
            trim_boundary=turn.trimmed.boundary if turn.trimmed else 0,
            entities=entities,
        )
        sent = engine_body.get("messages") or []
        if not _same_messages(sent, turn.conversation):
            # The engine saw other messages than the conversation (volatile values moved):
            # keep them whole, so time travel shows exactly what it saw.
            checkpoint = replace(checkpoint, engine_messages=[normalise(m) for m in sent])
        return await self.store.append(turn.session, checkpoint, blobs, prior=turn.prior)

    def _changed_entities(self, turn: Turn, reply: Message | None) -> dict[str, Any]:
        """Declared entities whose state this turn's messages set, materialised; the
        earlier turns' checkpoints hold the rest (`Stored.then` folds them)."""
        trimmer = self.trimmer_of(turn.session.tenant)
        if trimmer is None or not trimmer.spec.state_tools:
            return {}
        after = [*turn.conversation, reply] if reply is not None else turn.conversation
        old = turn.prior.entities
        new = latest_states(after, trimmer.spec.state_tools)
        return {entity: state for entity, state in new.items() if old.get(entity) != state}


def _same_messages(sent: list[Any], conversation: list[Message]) -> bool:
    """Whether the engine was sent the conversation. Mostly the very same objects (the
    stored history is put in front as it was read, and canonicalizing replaces only the
    system message), so identity answers most pairs; normalising every message of a long
    session on every turn had cost milliseconds."""
    return len(sent) == len(conversation) and all(
        a is b or normalise(a) == b for a, b in zip(sent, conversation, strict=True)
    )
