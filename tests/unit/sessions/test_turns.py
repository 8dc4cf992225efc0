"""A turn's checkpoint keeps the engine's messages whole only when they were not the
conversation, however the engine's body was built."""

from __future__ import annotations

import uuid
from typing import Any

from gateway.sessions.ids import SessionRef
from gateway.sessions.store import MemoryCheckpoints
from gateway.sessions.turns import SessionTurns

SYSTEM = {"role": "system", "content": "You are terse. Today is 2026-12-07."}
REPLY = {"role": "assistant", "content": "ok"}


async def committed(engine_messages: Any, store: MemoryCheckpoints, session: SessionRef) -> Any:
    turns = SessionTurns(store)
    body = {"model": "m", "messages": [{"role": "user", "content": "next"}]}
    turn, sent = await turns.begin(session, "delta", body)
    messages = engine_messages(sent["messages"])
    engine_body = {**sent, "messages": messages}
    await turns.commit(
        turn, engine_body=engine_body, reply=REPLY, usage=None, route={}, request_id="r",
        model="m",
    )  # fmt: skip
    return (await store.load(session))[-1].engine_messages


async def test_the_engine_s_messages_are_kept_only_when_they_differ() -> None:
    store, session = MemoryCheckpoints(), SessionRef("t", uuid.uuid4().hex)
    first = await committed(lambda m: [SYSTEM, *m], store, session)  # a message added
    assert first is not None and first[0] == SYSTEM
    # The conversation as it was put together, and equal copies of it: nothing kept.
    assert await committed(lambda m: m, store, session) is None
    assert await committed(lambda m: [dict(x) for x in m], store, session) is None
    # The system message changed (a canonicalizer moved the date out): kept whole.
    moved = await committed(
        lambda m: [{"role": "system", "content": "You are terse."}, *m[1:]], store, session
    )
    assert moved is not None and moved[0]["content"] == "You are terse."
    assert len(moved) == len((await store.load_stored(session)).messages) - 1  # all but the reply
