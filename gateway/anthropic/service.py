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
from gateway.anthropic.answer import message_object
from gateway.anthropic.context_editing import Edit, Tally, apply_edits, parse_edits
from gateway.anthropic.convert import ChatRequest, chat_request
from gateway.anthropic.stream import MessageEvents
from gateway.chat.inbound import check_array_length, check_depth, check_max_tokens, json_object
from gateway.delivery.served import ConvertedEvents, Served
from gateway.errors import InvalidRequest
from gateway.pipeline import Pipeline
from gateway.policy import Endpoint
from gateway.policy.schema import LimitsSpec
from gateway.request_context import RequestContext
from gateway.tenants.settings import TenantPolicies
from gateway.trimming.tokens import token_counter


class MessagesService:
    def __init__(self, pipeline: Pipeline, *, tenants: TenantPolicies | None = None) -> None:
        self._pipeline = pipeline
        self._tenants = tenants or pipeline.tenants
        self._tallies: dict[str | None, Tally] = {}  # by the trimming tokenizer

    async def create(
        self, raw: bytes, context: RequestContext, session_header: str | None = None
    ) -> Served:
        """`context`: as for a chat request. `session_header`: Claude Code's
        `X-Claude-Code-Session-Id`."""
        limits = self._tenants.of(context.access.name).limits
        request = _parse(raw, limits, count=False)
        edits = parse_edits(request.get("context_management"))
        converted = chat_request(request, session_header, refuse_hosted=_refuses(limits))
        body, applied = converted.body, None
        if edits is not None:
            body, applied = self._edited(edits, converted, context.access.name)
        message_id = f"msg_{uuid.uuid4().hex}"
        served = await self._pipeline.handle(Endpoint.chat, body, context)
        headers = {
            **served.headers,
            **gateway_headers.tools_dropped(converted.dropped_tools, context.request_id),
        }
        if served.stream is not None:
            events = MessageEvents(
                message_id, request, thinking=converted.thinking, applied_edits=applied
            )
            stream = ConvertedEvents(events.convert, served.stream)
            return replace(served, headers=headers, stream=stream)
        message = message_object(message_id, request, served.completion(), converted.thinking)
        if applied is not None:
            message["context_management"] = {"applied_edits": applied}
        return Served(headers, orjson.dumps(message), parsed=message)

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
        if edits is None:
            count = await self._pipeline.count_tokens(converted.body, context)
            return Served(headers, orjson.dumps({"input_tokens": count}))
        body, applied = self._edited(edits, converted, context.access.name)
        count = await self._pipeline.count_tokens(body, context)
        original = await self._pipeline.count_tokens(converted.body, context) if applied else count
        counted = {"input_tokens": count, "context_management": {"original_input_tokens": original}}
        return Served(headers, orjson.dumps(counted))

    def _edited(
        self, edits: tuple[Edit, ...], converted: ChatRequest, tenant: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The chat body with the request's context edits applied
        (gateway/anthropic/context_editing.py), and what they cleared."""
        tokenizer = self._tenants.of(tenant).trimming.tokenizer
        if tokenizer not in self._tallies:
            self._tallies[tokenizer] = Tally(token_counter(tokenizer))
        body = converted.body
        edited = apply_edits(edits, body["messages"], body.get("tools"), self._tallies[tokenizer])
        if edited.messages is not body["messages"]:
            body = {**body, "messages": edited.messages}
        return body, edited.applied


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
