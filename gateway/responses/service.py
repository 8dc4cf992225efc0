"""`POST /v1/responses`: continue the conversation `previous_response_id` names, from the
session checkpoints, and ask the engine through the ordinary chat pipeline (routing,
canonicalization, trimming, checkpointing all apply).

A response without `previous_response_id` starts a session named after it. Continuing from
the latest response of a session appends to it; continuing from an earlier one branches: a
fork of the session up to that turn. Instructions are not carried over from earlier
responses (as OpenAI specifies): each request's own replace them. The response record is
stored before the client hears the response is complete, so the next request may go to
any gateway replica at once.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

import orjson

from gateway.chat.inbound import (
    check_array_length,
    check_depth,
    check_max_tokens,
    client_schema,
    json_object,
)
from gateway.chat.messages import Message
from gateway.delivery.served import Served
from gateway.errors import InvalidRequest, NotFound
from gateway.pipeline import Pipeline
from gateway.policy import Endpoint
from gateway.policy.schema import LimitsSpec
from gateway.request_context import RequestContext
from gateway.responses.convert import (
    chat_body,
    input_messages,
    output_items,
    response_object,
    usage_of,
)
from gateway.responses.records import ResponseRecords
from gateway.responses.stream import ConvertedStream, ResponseEvents
from gateway.sessions.checkpoints import history
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import CheckpointStore, fork_to_new_id
from gateway.telemetry.record import RequestRecord
from gateway.tenants.identity import DEFAULT_TENANT, OPEN_ACCESS, Identity, TenantAccess
from gateway.tenants.settings import TenantPolicies


class ResponsesService:
    def __init__(
        self,
        pipeline: Pipeline,
        checkpoints: CheckpointStore,
        records: ResponseRecords,
        *,
        tenants: TenantPolicies | None = None,
    ) -> None:
        """`tenants`: each tenant's limits (gateway/tenants/settings.py); unset: the
        pipeline's."""
        self._pipeline = pipeline
        self._checkpoints = checkpoints
        self._records = records
        self._tenants = tenants or pipeline.tenants

    async def create(
        self,
        raw: bytes,
        record: RequestRecord,
        access: TenantAccess = OPEN_ACCESS,
        identity: Identity | None = None,
    ) -> Served:
        """`access`: the caller's tenant; its responses and sessions are the only ones it
        can continue (another tenant's `previous_response_id` is 404). `identity`: the
        caller's key (its rate limits)."""
        tenant = access.name
        request = _parse(raw, self._tenants.of(tenant).limits)
        response_id = f"resp_{uuid.uuid4().hex}"
        created_at = int(time.time())
        store = request.get("store", True) is not False
        session, past = await self._continue_from(
            request.get("previous_response_id"), tenant, branch=store
        )
        instructions = request.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidRequest("`instructions` must be a string.", param="instructions")
        messages: list[Message] = (
            [{"role": "system", "content": instructions}] if instructions else []
        )
        messages += past + input_messages(request.get("input"))
        stream = bool(request.get("stream"))
        body = chat_body(request, messages, stream)
        context = RequestContext(
            request_id=response_id,
            session=(session or SessionRef(tenant, response_id)) if store else None,
            record=record,
            access=access,
            identity=identity,
        )
        served = await self._pipeline.handle(Endpoint.chat, body, context)
        record_base = {
            "session": context.session.id if context.session else None,
            "request_id": response_id,
            "instructions": bool(instructions),
        }

        async def keep(response: dict[str, Any]) -> None:
            if store:
                kept = {**record_base, "response": response}
                await self._records.put(response_id, kept, tenant=tenant)

        if served.stream is not None:  # relayed, or replayed after checks
            events = ResponseEvents(response_id, request, created_at, keep)
            return replace(served, stream=ConvertedStream(events, served.stream))
        completion = served.completion()
        choice = (completion.get("choices") or [{}])[0]
        response = response_object(
            response_id,
            request,
            status="completed",
            created_at=created_at,
            output=output_items(response_id, choice.get("message") or {}),
            usage=usage_of(completion.get("usage")),
            finish_reason=choice.get("finish_reason"),
        )
        await keep(response)
        return Served(served.headers, orjson.dumps(response))

    async def get(self, response_id: str, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        record = await self._records.get(response_id, tenant=tenant)
        if record is None:
            raise _not_found(response_id, "response_id")
        response: dict[str, Any] = record["response"]
        return response

    async def delete(self, response_id: str, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        if not await self._records.delete(response_id, tenant=tenant):
            raise _not_found(response_id, "response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    async def _continue_from(
        self, previous: Any, tenant: str, *, branch: bool
    ) -> tuple[SessionRef | None, list[Message]]:
        """The session to continue and its history up to `previous`; continuing from an
        earlier response forks a branch, unless `branch` is False (a response not stored
        adds no turn, so a branch would only be an orphan copy)."""
        if previous is None:
            return None, []
        if not isinstance(previous, str):
            raise InvalidRequest(
                "`previous_response_id` must be a string.", param="previous_response_id"
            )
        record = await self._records.get(previous, tenant=tenant)
        if record is None or not record.get("session"):
            raise _not_found(previous, "previous_response_id")
        session = SessionRef(tenant, record["session"])
        checkpoints = await self._checkpoints.load(session)
        turn = next(
            (i + 1 for i, c in enumerate(checkpoints) if c.request_id == record["request_id"]),
            None,
        )
        if turn is None:
            raise _not_found(previous, "previous_response_id")
        if turn < len(checkpoints) and branch:  # continuing from an earlier response
            session = await fork_to_new_id(self._checkpoints, session, turn, f"{session.id}.b-")
        past = history(checkpoints[:turn])
        if record.get("instructions") and past and past[0].get("role") == "system":
            past = past[1:]  # instructions are not carried over
        return session, past


def _not_found(response_id: str, param: str) -> NotFound:
    return NotFound(
        f"Response with id '{response_id}' not found.", param=param, code="response_not_found"
    )


def _parse(raw: bytes, limits: LimitsSpec) -> dict[str, Any]:
    """The client's own request, held to the policy's limits under the Responses API's
    names (the chat request it becomes also carries the session's history, which the
    pipeline's check counts too)."""
    request = json_object(raw)
    for name in ("model", "input"):
        if request.get(name) is None:
            raise InvalidRequest(
                f"Missing required parameter: '{name}'.",
                param=name,
                code="missing_required_parameter",
            )
    if not isinstance(request["model"], str):
        raise InvalidRequest("`model` must be a string.", param="model")
    text = request.get("text")
    if text is not None and not (isinstance(text, dict) and _object_or_none(text.get("format"))):
        raise InvalidRequest(
            "`text` must be an object whose `format` is an object.",
            param="text",
            code="invalid_type",
        )
    for name, limit in (("input", limits.max_messages), ("tools", limits.max_tools)):
        if isinstance(request.get(name), list):
            check_array_length(request[name], limit, name)
    check_depth(request, limits.max_json_depth, walk="input")
    check_max_tokens(request, ("max_output_tokens",), limits.max_tokens)
    _check_text_schema(text)
    return request


def _check_text_schema(text: dict[str, Any] | None) -> None:
    """A `json_schema` text format's schema, vetted under the name the client gave it (the
    chat request it becomes would name `response_format.json_schema.schema`)."""
    text_format = text.get("format") if text is not None else None
    if isinstance(text_format, dict) and text_format.get("type") == "json_schema":
        schema = text_format.get("schema")
        if isinstance(schema, dict):
            client_schema(schema, "text.format.schema")


def _object_or_none(value: Any) -> bool:
    return value is None or isinstance(value, dict)
