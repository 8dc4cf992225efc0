"""Session time travel: list a session's checkpoints, see exactly what the engine was sent
at turn n and why, fetch a tool result compaction elided, fork a session from a
checkpoint, delete a session."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.json_response import json_response
from gateway.chat.inbound import json_object
from gateway.errors import Conflict, InvalidRequest, NotFound
from gateway.runtime import current
from gateway.sessions.checkpoints import Checkpoint, Stored, engine_request, history
from gateway.sessions.ids import SessionRef, check_session_id
from gateway.sessions.store import CheckpointStore, fork_to_new_id
from gateway.tenants.identity import access_of
from gateway.trimming.conversation import tool_results
from gateway.untrusted.client_text import ascii_number


def _session(session_id: str, request: Request) -> SessionRef:
    """The caller's tenant's session: another tenant's id names nothing (404)."""
    tenant = access_of(request.scope["state"]).name
    return SessionRef(tenant, check_session_id(session_id, param="session_id"))


def checkpoint_summary(turn: int, checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "turn": turn,
        "created_at": checkpoint.created_at,
        "request_id": checkpoint.request_id,
        "model": checkpoint.model,
        "mode": checkpoint.mode,
        "new_messages": len(checkpoint.new_messages),
        "rewrite": checkpoint.rewrite,
        "route": checkpoint.route,
        "usage": checkpoint.usage,
    }


async def _load(store: CheckpointStore, session: SessionRef) -> list[Checkpoint]:
    checkpoints = await store.load(session)
    if not checkpoints:
        raise NotFound(f"No session `{session.id}` (or it expired).", code="session_not_found")
    return checkpoints


def _turn(value: Any, last: int, *, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= last:
        raise InvalidRequest(f"`{param}` must be a turn number from 1 to {last}.", param=param)
    return value


def build_sessions_router() -> APIRouter:
    router = APIRouter()

    def store_of(request: Request) -> CheckpointStore:
        return current(request.app.state).checkpoints

    @router.get("/v1/sessions/{session_id}/checkpoints")
    async def list_checkpoints(session_id: str, request: Request) -> Response:
        session = _session(session_id, request)
        checkpoints = await _load(store_of(request), session)
        data = [checkpoint_summary(i + 1, c) for i, c in enumerate(checkpoints)]
        return json_response({"object": "list", "session_id": session.id, "data": data})

    @router.get("/v1/sessions/{session_id}/checkpoints/{turn}")
    async def get_checkpoint(session_id: str, turn: str, request: Request) -> Response:
        session = _session(session_id, request)
        store = store_of(request)
        checkpoints = await _load(store, session)
        number = ascii_number(turn)
        if number is None or not 1 <= number <= len(checkpoints):
            raise NotFound(
                f"Session `{session.id}` has turns 1 to {len(checkpoints)}, not `{turn}`.",
                code="checkpoint_not_found",
            )
        checkpoint = checkpoints[number - 1]
        body = {
            "object": "session.checkpoint",
            "session_id": session.id,
            **checkpoint_summary(number, checkpoint),
            "client_messages": checkpoint.new_messages,
            "engine_request": engine_request(checkpoints, number, await store.blobs(session)),
            "reply": checkpoint.reply,
            # every declared entity's state as of this turn (trimming.state_tools)
            "entities": Stored().then(checkpoints[:number]).entities,
        }
        return json_response(body)

    @router.post("/v1/sessions/{session_id}/fork")
    async def fork(session_id: str, request: Request) -> Response:
        source = _session(session_id, request)
        store = store_of(request)
        checkpoints = await _load(store, source)
        raw = await request.body()
        options = json_object(raw) if raw.strip() else {}
        turns = _turn(options.get("turn", len(checkpoints)), len(checkpoints), param="turn")
        named = options.get("session_id")
        if named:
            if not isinstance(named, str):
                raise InvalidRequest("`session_id` must be a string.", param="session_id")
            target = SessionRef(source.tenant, check_session_id(named, param="session_id"))
            if target == source:
                raise InvalidRequest("A fork needs a new session id.", param="session_id")
            if not await store.fork(source, turns, target):
                raise Conflict(
                    f"Session `{target.id}` exists already, and a fork never writes over a "
                    "session: name a new id (or delete that session first).",
                    param="session_id",
                    code="session_exists",
                )
        else:
            target = await fork_to_new_id(store, source, turns, f"{source.id}.fork-")
        body = {
            "object": "session",
            "id": target.id,
            "turns": turns,
            "forked_from": {"session_id": source.id, "turn": turns},
        }
        return json_response(body, 201)

    @router.get("/v1/sessions/{session_id}/artifacts/{handle}")
    async def artifact(session_id: str, handle: str, request: Request) -> Response:
        """A tool result that compaction elided, whole (handles are `m<message index>`)."""
        session = _session(session_id, request)
        messages = history(await _load(store_of(request), session))
        index = ascii_number(handle[1:]) if handle[:1] == "m" else None
        results = tool_results(messages)
        if index is None or index not in results:
            raise NotFound(
                f"Session `{session.id}` has no tool result `{handle}`.", code="artifact_not_found"
            )
        result = results[index]
        body = {
            "object": "session.artifact",
            "id": handle,
            "session_id": session.id,
            "tool": result.name,
            "arguments": result.arguments,
            "content": messages[index].get("content"),
        }
        return json_response(body)

    @router.delete("/v1/sessions/{session_id}")
    async def delete(session_id: str, request: Request) -> Response:
        session = _session(session_id, request)
        if not await store_of(request).delete(session):
            raise NotFound(f"No session `{session.id}` (or it expired).", code="session_not_found")
        return json_response({"id": session.id, "object": "session.deleted", "deleted": True})

    return router
