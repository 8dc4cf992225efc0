"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: the Anthropic Messages API,
answered by the engines' Chat Completions through the ordinary chat pipeline, so that
everything the gateway does to chat traffic (canonicalization, cache-affinity routing,
tiers, sessions and checkpoints, trimming, approvals, quota, traces, metrics, usage)
applies to it too. Why translating and not passing through to vLLM's own `/v1/messages`:
docs/concepts/anthropic-api.md.

The conversation a request continues is read from Claude Code's `X-Claude-Code-Session-Id`
header, else from `metadata.user_id` (its session part), and carried to the pipeline as the
chat body's `prompt_cache_key`: a routing key always, and a session key when
`sessions.key_from` lists `client` (gateway/sessions/ids.py).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import orjson

from gateway import headers as gateway_headers
from gateway.anthropic.answer import message_object, message_shell
from gateway.anthropic.compaction import Compact, MessageCompactor, compaction_now
from gateway.anthropic.context_editing import (
    CLEAR_TOOL_USES,
    Edit,
    Tally,
    apply_edits,
    clear_thinking,
    default_thinking,
    parse_edits,
)
from gateway.anthropic.convert import ChatRequest, chat_request
from gateway.anthropic.stream import MessageEvents
from gateway.chat.inbound import check_array_length, check_depth, check_max_tokens, json_object
from gateway.delivery.served import ConvertedEvents, Replay, Served
from gateway.errors import InvalidRequest
from gateway.pipeline import Pipeline
from gateway.policy import Endpoint
from gateway.policy.schema import LimitsSpec
from gateway.request_context import RequestContext
from gateway.responses.compaction import Compactions
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenants.settings import TenantPolicies
from gateway.trimming.tokens import token_counter


class MessagesService:
    def __init__(
        self,
        pipeline: Pipeline,
        *,
        tenants: TenantPolicies | None = None,
        compactions: Compactions | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self._pipeline = pipeline
        self._metrics = metrics
        self._tenants = tenants or pipeline.tenants
        self._tallies: dict[str | None, Tally] = {}  # by the trimming tokenizer
        self._compactor = MessageCompactor(compactions, self._tenants)

    async def create(
        self, raw: bytes, context: RequestContext, session_header: str | None = None
    ) -> Served:
        """`context`: as for a chat request. `session_header`: Claude Code's
        `X-Claude-Code-Session-Id`."""
        tenant = context.access.name
        limits = self._tenants.of(tenant).limits
        request = _parse(raw, limits, count=False)
        edits = parse_edits(request.get("context_management"))
        compact = compaction_now(request.get("compaction")) or next(
            (edit for edit in edits or () if isinstance(edit, Compact)), None
        )
        converted = chat_request(request, session_header, refuse_hosted=_refuses(limits))
        if compact is not None:  # refused before anything is kept, as the engine call would be
            self._pipeline.check(Endpoint.chat, converted.body, context)
        body, applied, block = await self._prepared(converted, edits, compact, tenant)
        message_id = f"msg_{uuid.uuid4().hex}"
        events = MessageEvents(
            message_id,
            request,
            thinking=converted.thinking,
            applied_edits=applied,
            compaction=block,
        )
        dropped = gateway_headers.tools_dropped(converted.dropped_tools, context.request_id)
        if block is not None and compact is not None and compact.pause:
            return _compaction_only(message_id, request, block, applied, events, dropped)
        served = await self._pipeline.handle(Endpoint.chat, body, context)
        headers = {**served.headers, **dropped}
        if served.stream is not None:
            stream = ConvertedEvents(events.convert, served.stream)
            return replace(served, headers=headers, stream=stream)
        message = message_object(message_id, request, served.completion(), converted.thinking)
        if block is not None:
            message["content"].insert(0, block)
        if applied is not None:
            message["context_management"] = {"applied_edits": applied}
        return Served(headers, orjson.dumps(message), parsed=message)

    async def _prepared(
        self,
        converted: ChatRequest,
        edits: tuple[Edit, ...] | None,
        compact: Compact | None,
        tenant: str,
    ) -> tuple[dict[str, Any], list[dict[str, Any]] | None, dict[str, Any] | None]:
        """The chat body the engine is sent: a sent-back compaction block's conversation put
        in its place, the context edits applied, and compacted if asked and due; with what
        the edits cleared and the compaction block the answer starts with."""
        body = await self._history(converted, edits, tenant)
        applied = None
        if edits is not None:
            body, applied = self._edited(edits, body, tenant)
        block = None
        if compact is not None:
            body, block, saved = await self._compactor.compact(body, compact, tenant)
            if block is not None:
                self._count("compaction", saved)
        for edit in applied or ():
            kind = "clear_tool_uses" if edit["type"] == CLEAR_TOOL_USES else "clear_thinking"
            self._count(kind, edit["cleared_input_tokens"])
        return body, applied, block

    def _count(self, edit: str, tokens: int) -> None:
        if self._metrics is not None:
            self._metrics.child(self._metrics.context_edits, "messages", edit).inc()
            self._metrics.child(self._metrics.context_edit_tokens, "messages", edit).inc(tokens)

    async def count_tokens(
        self, raw: bytes, context: RequestContext, session_header: str | None = None
    ) -> Served:
        limits = self._tenants.of(context.access.name).limits
        request = _parse(raw, limits, count=True)
        edits = parse_edits(request.get("context_management"))
        converted = chat_request(
            {**request, "max_tokens": 1, "stream": False},
            session_header,
            refuse_hosted=_refuses(limits),
        )
        headers = gateway_headers.tools_dropped(converted.dropped_tools, context.request_id)
        tenant = context.access.name
        body = await self._history(converted, edits, tenant)
        if edits is None:
            count = await self._pipeline.count_tokens(body, context)
            return Served(headers, orjson.dumps({"input_tokens": count}))
        edited, applied = self._edited(edits, body, tenant)
        count = await self._pipeline.count_tokens(edited, context)
        original = await self._pipeline.count_tokens(body, context) if applied else count
        counted = {"input_tokens": count, "context_management": {"original_input_tokens": original}}
        return Served(headers, orjson.dumps(counted))

    def _edited(
        self, edits: tuple[Edit, ...], body: dict[str, Any], tenant: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The chat body with the request's context edits applied
        (gateway/anthropic/context_editing.py), and what they cleared."""
        edited = apply_edits(edits, body["messages"], body.get("tools"), self._tally(tenant))
        if edited.messages is not body["messages"]:
            body = {**body, "messages": edited.messages}
        return body, edited.applied

    async def _history(
        self, converted: ChatRequest, edits: tuple[Edit, ...] | None, tenant: str
    ) -> dict[str, Any]:
        """The chat body before the request's own edits, as Anthropic's API would read it:
        a sent-back compaction block's conversation in its place, and the history's
        thinking kept by Anthropic's default where the edits do not say (not reported:
        nobody asked; gateway/anthropic/context_editing.py)."""
        body = converted.body
        if converted.compaction is not None:
            body = await self._compactor.restore(converted, tenant)
        default = default_thinking(edits, converted.thinking)
        if default is None:
            return body
        messages, _ = clear_thinking(default, body["messages"], self._tally(tenant))
        return body if messages is body["messages"] else {**body, "messages": messages}

    def _tally(self, tenant: str) -> Tally:
        """The message token counts of the tenant's trimming tokenizer."""
        tokenizer = self._tenants.of(tenant).trimming.tokenizer
        if tokenizer not in self._tallies:
            self._tallies[tokenizer] = Tally(token_counter(tokenizer))
        return self._tallies[tokenizer]


def _compaction_only(
    message_id: str,
    request: dict[str, Any],
    block: dict[str, Any],
    applied: list[dict[str, Any]] | None,
    events: MessageEvents,
    headers: dict[str, str],
) -> Served:
    """The answer that is a compaction block alone (`pause_after_compaction`, or the
    top-level `compaction`): no engine is asked."""
    if request.get("stream"):
        return Served(headers, stream=Replay(events.compaction_only()))
    message = {
        **message_shell(message_id, request),
        "content": [block],
        "stop_reason": "compaction",
    }
    if applied is not None:
        message["context_management"] = {"applied_edits": applied}
    return Served(headers, orjson.dumps(message), parsed=message)


def _refuses(limits: LimitsSpec) -> bool:
    return limits.hosted_tools == "refuse"


def _parse(raw: bytes, limits: LimitsSpec, *, count: bool) -> dict[str, Any]:
    """The client's own request, held to the policy's limits under the Messages API's
    names. `max_tokens` is required, but not to count tokens."""
    request = json_object(raw)
    required = ("model", "messages") if count else ("model", "max_tokens", "messages")
    for name in required:
        if request.get(name) is None:
            raise InvalidRequest(f"{name}: Field required", param=name)
    if not isinstance(request["model"], str):
        raise InvalidRequest("`model` must be a string.", param="model")
    if not count:
        tokens = request["max_tokens"]
        if type(tokens) is not int or tokens < 1:
            raise InvalidRequest("`max_tokens` must be a positive integer.", param="max_tokens")
        check_max_tokens(request, ("max_tokens",), limits.max_tokens)
    for name, limit in (("messages", limits.max_messages), ("tools", limits.max_tools)):
        if isinstance(request.get(name), list):
            check_array_length(request[name], limit, name)
    check_depth(request, limits.max_json_depth, walk="messages")
    return request
