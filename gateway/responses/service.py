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

import logging
import time
import uuid
from dataclasses import replace
from typing import Any

import orjson

from gateway import headers as gateway_headers
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
from gateway.request_context import Charges, RequestContext
from gateway.responses.compaction import (
    Compactions,
    compact,
    compact_past,
    compact_threshold,
    compaction_item,
)
from gateway.responses.convert import (
    chat_body,
    developer_item,
    input_messages,
    output_items,
    response_object,
    usage_of,
)
from gateway.responses.input_items import Page, kept_inputs, listing
from gateway.responses.records import ResponseRecords
from gateway.responses.stream import ConvertedStream, ResponseEvents
from gateway.responses.tools import EngineTools, engine_tools
from gateway.sessions.checkpoints import history
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import CheckpointStore, fork_to_new_id
from gateway.state.stored_bytes import StoredBytes
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import RequestRecord
from gateway.tenants.identity import DEFAULT_TENANT, OPEN_ACCESS, Identity, TenantAccess
from gateway.tenants.settings import TenantPolicies
from gateway.trimming.conversation import prefix_length
from gateway.trimming.tokens import TokenCounter, token_counter

log = logging.getLogger(__name__)


class ResponsesService:
    def __init__(
        self,
        pipeline: Pipeline,
        checkpoints: CheckpointStore,
        records: ResponseRecords,
        *,
        compactions: Compactions | None = None,
        tenants: TenantPolicies | None = None,
        stored: StoredBytes | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        """`tenants`: each tenant's limits (gateway/tenants/settings.py); unset: the
        pipeline's. `compactions`: where compacted conversations are kept (without it,
        compaction items are refused). `stored`: what each tenant may still store."""
        self._pipeline = pipeline
        self._stored = stored
        self._checkpoints = checkpoints
        self._records = records
        self._compactions = compactions
        self._metrics = metrics  # compactions counted (gateway_context_edits_total)
        self._tenants = tenants or pipeline.tenants
        self._counters: dict[str | None, TokenCounter] = {}  # by tokenizer file, loaded once

    async def create(
        self,
        raw: bytes,
        record: RequestRecord,
        access: TenantAccess = OPEN_ACCESS,
        identity: Identity | None = None,
        charges: Charges | None = None,
    ) -> Served:
        """`access`: the caller's tenant; its responses and sessions are the only ones it
        can continue (another tenant's `previous_response_id` is 404). `identity`: the
        caller's key (its rate limits); `charges`: the edge's, where admission leaves
        what it charged."""
        tenant = access.name
        limits = self._tenants.of(tenant).limits
        request = _parse(raw, limits)
        response_id = f"resp_{uuid.uuid4().hex}"
        created_at = int(time.time())
        store = request.get("store", True) is not False
        if store and self._stored is not None:  # its session turn is checked too, if kept
            await self._stored.admit(tenant)
        session, messages, tools = await self._conversation(request, limits, tenant, branch=store)
        messages, compacted = await self._compacted_if_due(request, messages, tenant)
        stream = bool(request.get("stream"))
        body = chat_body(request, messages, stream, tools)
        context = RequestContext(
            request_id=response_id,
            session=(session or SessionRef(tenant, response_id)) if store else None,
            record=record,
            access=access,
            identity=identity,
            charges=charges or Charges(),
        )
        served = await self._pipeline.handle(Endpoint.chat, body, context)
        if dropped := gateway_headers.tools_dropped(tools.dropped, response_id):
            served = replace(served, headers={**served.headers, **dropped})
        record_base = {
            "session": context.session.id if context.session else None,
            "request_id": response_id,
            "instructions": bool(request.get("instructions")),
            # What `GET /v1/responses/{id}/input_items` lists (gateway/responses/input_items.py).
            "input": kept_inputs(_input_of(request), response_id),
            "previous": request.get("previous_response_id"),
        }

        async def keep(response: dict[str, Any]) -> None:
            if store:
                kept = {**record_base, "response": response}
                await self._records.put(response_id, kept, tenant=tenant)

        if served.stream is not None:  # relayed, or replayed after checks
            events = ResponseEvents(response_id, request, created_at, keep, tools, compacted)
            return replace(served, stream=ConvertedStream(events, served.stream))
        completion = served.completion()
        choice = (completion.get("choices") or [{}])[0]
        response = response_object(
            response_id,
            request,
            status="completed",
            created_at=created_at,
            output=[*compacted, *output_items(response_id, choice.get("message") or {}, tools)],
            usage=usage_of(completion.get("usage")),
            finish_reason=choice.get("finish_reason"),
        )
        await keep(response)
        return Served(served.headers, orjson.dumps(response))

    async def input_tokens(
        self,
        raw: bytes,
        record: RequestRecord,
        access: TenantAccess = OPEN_ACCESS,
        identity: Identity | None = None,
    ) -> Served:
        """`POST /v1/responses/input_tokens`: how many prompt tokens the engine would see
        for this request (its history from `previous_response_id` included), counted by
        the engine's own tokenizer and chat template; nothing generated, nothing kept."""
        limits = self._tenants.of(access.name).limits
        request = _parse(raw, limits, require_input=False)
        _, messages, tools = await self._conversation(request, limits, access.name, branch=False)
        body = chat_body(request, messages, False, tools)
        context = RequestContext(
            request_id=f"count_{uuid.uuid4().hex}",
            record=record,
            access=access,
            identity=identity,
        )
        count = await self._pipeline.count_tokens(body, context)
        answer = {"object": "response.input_tokens", "input_tokens": count}
        return Served(
            gateway_headers.tools_dropped(tools.dropped, context.request_id), orjson.dumps(answer)
        )

    async def compact(
        self,
        raw: bytes,
        record: RequestRecord,
        access: TenantAccess = OPEN_ACCESS,
        identity: Identity | None = None,
    ) -> Served:
        """`POST /v1/responses/compact` (gateway/responses/compaction.py): the leading
        developer messages as they were, then one compaction item for the rest."""
        tenant = access.name
        settings = self._tenants.of(tenant)
        request = _parse(raw, settings.limits)
        if self._compactions is None:
            raise InvalidRequest("Compaction needs the state store.", code="unsupported")
        _, messages, _ = await self._conversation(request, settings.limits, tenant, branch=False)
        spec = settings.trimming
        trimmed = compact(messages, spec, self._counter(spec.tokenizer))
        start = prefix_length(trimmed.messages)
        content = await self._compactions.put(tenant, trimmed.messages[start:])
        self._count_compaction(trimmed.saved_tokens)
        own = 1 if request.get("instructions") else 0  # the instructions: sent every time
        output = [developer_item(m) for m in trimmed.messages[own:start]]
        output.append(compaction_item(content))
        log.info(
            "compacted %d messages to %d (%d history tokens, %d saved)",
            len(messages), len(trimmed.messages), trimmed.history_tokens, trimmed.saved_tokens,
        )  # fmt: skip
        # Usage in the trimming tokenizer's counts: the history before, and after.
        before = trimmed.history_tokens + trimmed.saved_tokens
        usage = {"prompt_tokens": before, "completion_tokens": trimmed.history_tokens}
        compacted = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": output,
            "usage": usage_of(usage),
        }
        return Served({}, orjson.dumps(compacted))

    async def _compacted_if_due(
        self, request: dict[str, Any], messages: list[Message], tenant: str
    ) -> tuple[list[Message], list[dict[str, Any]]]:
        """Server-side compaction, where `context_management` asks for it: past its
        threshold (the policy's trimming high-water mark when it names none), the
        conversation as the engine gets it compacted, and the compaction item the
        response's output starts with; else the conversation as it is, and no item."""
        spec = self._tenants.of(tenant).trimming
        limit = compact_threshold(request.get("context_management"), spec.high_water_tokens)
        if limit is None:
            return messages, []
        if self._compactions is None:
            raise InvalidRequest(
                "Compaction needs the state store.",
                param="context_management",
                code="unsupported",
            )
        trimmed = compact_past(messages, limit, spec, self._counter(spec.tokenizer))
        if trimmed is None or trimmed.messages == messages:
            return messages, []
        start = prefix_length(trimmed.messages)
        content = await self._compactions.put(tenant, trimmed.messages[start:])
        self._count_compaction(trimmed.saved_tokens)
        log.info(
            "compacted past %d tokens: %d messages to %d (%d saved)",
            limit, len(messages), len(trimmed.messages), trimmed.saved_tokens,
        )  # fmt: skip
        return trimmed.messages, [compaction_item(content)]

    def _count_compaction(self, saved_tokens: int) -> None:
        if self._metrics is not None:
            metrics = self._metrics
            metrics.child(metrics.context_edits, "responses", "compaction").inc()
            metrics.child(metrics.context_edit_tokens, "responses", "compaction").inc(saved_tokens)

    def _counter(self, tokenizer: str | None) -> TokenCounter:
        if tokenizer not in self._counters:
            self._counters[tokenizer] = token_counter(tokenizer)
        return self._counters[tokenizer]

    async def _conversation(
        self, request: dict[str, Any], limits: LimitsSpec, tenant: str, *, branch: bool
    ) -> tuple[SessionRef | None, list[Message], EngineTools]:
        """The session continued, the whole conversation as chat messages (instructions,
        the stored history, the new input), and the tools as the engine takes them."""
        session, past = await self._continue_from(
            request.get("previous_response_id"), tenant, branch=branch
        )
        instructions = request.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidRequest("`instructions` must be a string.", param="instructions")
        messages: list[Message] = (
            [{"role": "system", "content": instructions}] if instructions else []
        )
        items = _input_of(request)
        compacted = await self._compactions.hydrate(items, tenant) if self._compactions else {}
        messages += past + input_messages(items, compacted, limits.media_url_hosts)
        tools = engine_tools(request.get("tools"), refuse_hosted=limits.hosted_tools == "refuse")
        return session, messages, tools

    async def get(self, response_id: str, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        record = await self._records.get(response_id, tenant=tenant)
        if record is None:
            raise _not_found(response_id, "response_id")
        response: dict[str, Any] = record["response"]
        return response

    async def input_items(
        self, response_id: str, page: Page, tenant: str = DEFAULT_TENANT
    ) -> dict[str, Any]:
        """`GET /v1/responses/{id}/input_items`: the items the response was made from,
        those of the responses it continued included (gateway/responses/input_items.py)."""
        record = await self._records.get(response_id, tenant=tenant)
        if record is None:
            raise _not_found(response_id, "response_id")

        async def read(earlier: str) -> dict[str, Any] | None:
            return await self._records.get(earlier, tenant=tenant)

        return await listing(record, read, page)

    async def cancel(self, response_id: str, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        """`POST /v1/responses/{id}/cancel`: only a background response can be cancelled,
        and this gateway answers every response in the foreground, so a stored one is
        complete: refused as OpenAI refuses a foreground response."""
        if await self._records.get(response_id, tenant=tenant) is None:
            raise _not_found(response_id, "response_id")
        raise InvalidRequest(
            "Only responses created with `background: true` can be cancelled, and this "
            f"gateway answers every response in the foreground: '{response_id}' is complete.",
            param="response_id",
            code="not_cancellable",
        )

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
        latest = await self._checkpoints.load_stored(session)
        if latest.turns and latest.last_request_id == record["request_id"]:
            past = latest.messages  # continuing the latest response: no branch, no turn walk
            return session, _without_instructions(record, past)
        checkpoints = await self._checkpoints.load(session)
        turn = next(
            (i + 1 for i, c in enumerate(checkpoints) if c.request_id == record["request_id"]),
            None,
        )
        if turn is None:
            raise _not_found(previous, "previous_response_id")
        if turn < len(checkpoints) and branch:  # continuing from an earlier response
            session = await fork_to_new_id(self._checkpoints, session, turn, f"{session.id}.b-")
        return session, _without_instructions(record, history(checkpoints[:turn]))


def _not_found(response_id: str, param: str) -> NotFound:
    return NotFound(
        f"Response with id '{response_id}' not found.", param=param, code="response_not_found"
    )


# Fields naming what OpenAI keeps and this gateway does not, and what to send instead.
_NOT_KEPT = {
    "conversation": "Conversation objects are not kept by this gateway: continue with "
    "`previous_response_id`, or send the whole input.",
    "prompt": "Prompt templates are kept by OpenAI, not by this gateway: send the prompt's "
    "text as `instructions`.",
}


def _parse(raw: bytes, limits: LimitsSpec, *, require_input: bool = True) -> dict[str, Any]:
    """The client's own request, held to the policy's limits under the Responses API's
    names (the chat request it becomes also carries the session's history, which the
    pipeline's check counts too)."""
    request = json_object(raw)
    for name in ("model", "input") if require_input else ("model",):
        if request.get(name) is None:
            raise InvalidRequest(
                f"Missing required parameter: '{name}'.",
                param=name,
                code="missing_required_parameter",
            )
    if not isinstance(request["model"], str):
        raise InvalidRequest("`model` must be a string.", param="model")
    for name, instead in _NOT_KEPT.items():  # silently dropped, what they hold would be lost
        if request.get(name) is not None:
            raise InvalidRequest(instead, param=name, code="unsupported_parameter")
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


def _input_of(request: dict[str, Any]) -> Any:
    """The request's input items; none given (or an empty string): none. Anything but a
    string or a list is refused by `input_messages`, falsy or not (`0` was once no input)."""
    items = request.get("input")
    return [] if items is None or items == "" else items


def _object_or_none(value: Any) -> bool:
    return value is None or isinstance(value, dict)


def _without_instructions(record: dict[str, Any], past: list[Message]) -> list[Message]:
    """The history a continuation carries: instructions are not carried over."""
    if record.get("instructions") and past and past[0].get("role") == "system":
        return past[1:]
    return past
