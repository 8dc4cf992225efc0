"""The API calls agents make on every step (`POST /v1/chat/completions`, `/v1/completions`,
`/v1/embeddings`, `/v1/responses`, and Anthropic's `/v1/messages` and
`/v1/messages/count_tokens`), answered in plain ASGI ahead of FastAPI's router.

Profiling showed FastAPI's router, its dependency solving and its middleware layers
(each wrapping `send`) cost more per request than the gateway's own pipeline; these
endpoints take no path or query parameters and read their body raw, so none of that
machinery does anything for them. Everything else (models, health, sessions, usage,
the dashboard, 404s) goes through FastAPI as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.chat.custom_tools import custom_call_events, to_custom_calls, to_functions
from gateway.chat.inbound import json_object
from gateway.chat.legacy_functions import (
    function_call_events,
    to_function_call,
    to_tools,
)
from gateway.delivery.served import ConvertedEvents, EventStream, Served
from gateway.edge.body import read_body
from gateway.errors import GatewayError, MethodNotAllowed, error_response, forget_frames
from gateway.pipeline import Pipeline
from gateway.policy import Endpoint
from gateway.request_context import Charges, RequestContext
from gateway.runtime import Runtime, current
from gateway.telemetry.record import RequestRecord
from gateway.tenants.identity import access_of, identity_of

log = logging.getLogger(__name__)

_ENDPOINTS = {endpoint.path: endpoint for endpoint in Endpoint}
_RESPONSES = "/v1/responses"
_INPUT_TOKENS = "/v1/responses/input_tokens"
_COMPACT = "/v1/responses/compact"
_MESSAGES = "/v1/messages"
_COUNT_TOKENS = "/v1/messages/count_tokens"
_OWN_SHAPES = frozenset({_RESPONSES, _INPUT_TOKENS, _COMPACT, _MESSAGES, _COUNT_TOKENS})
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ApiCalls:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app  # FastAPI's own stack, for every other route
        self._limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path") if scope["type"] == "http" else None
        endpoint = _ENDPOINTS.get(path) if path else None
        if endpoint is None and path not in _OWN_SHAPES:
            await self.app(scope, receive, send)
            return
        state = scope["state"]
        request_id: str = state["request_id"]
        record = state.get("telemetry") or RequestRecord.detached()
        charges = state.get("charges") or Charges()  # for the edge: made with the record
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(f"Method {scope['method']} is not allowed on {path}.")
            request = Request(scope, receive)
            access = access_of(state)  # the caller's tenant (gateway/edge/auth.py)
            body = await read_body(request, access.max_body_bytes or self._limit)
            runtime = current(scope["app"].state)  # the policy this request is served under
            if path in (_RESPONSES, _INPUT_TOKENS, _COMPACT):
                responses = runtime.responses
                if path == _RESPONSES:  # served by the pipeline: admitted, charged
                    served = await responses.create(
                        body, record, access, identity_of(state), charges
                    )
                else:
                    call = responses.input_tokens if path == _INPUT_TOKENS else responses.compact
                    served = await call(body, record, access, identity_of(state))
            else:
                headers = request.headers
                context = RequestContext(
                    request_id=request_id,
                    session_id=headers.get("x-session-id") or None,
                    context_mode=headers.get("x-context-mode"),
                    task=headers.get("x-task") or None,
                    record=record,
                    access=access,
                    identity=identity_of(state),
                    charges=charges,
                )
                served = await _call(runtime, endpoint, str(path), body, context, headers)
            response = render(served)
        except GatewayError as exc:
            record.error_type = exc.label
            response = error_response(exc, request_id=request_id, path=path)
            forget_frames(exc)  # answered: nothing may keep the request alive through it
        except Exception:  # a bug: logged whole, the client told nothing internal
            log.exception("unhandled error on %s %s", scope["method"], path)
            record.error_type = "internal_error"
            error = GatewayError.internal()
            response = error_response(error, request_id=request_id, path=path)
        await response(scope, receive, send)


async def _call(
    runtime: Runtime,
    endpoint: Endpoint | None,
    path: str,
    body: bytes,
    context: RequestContext,
    headers: Headers,
) -> Served:
    if endpoint is None:  # the Anthropic Messages API (gateway/anthropic/)
        messages = runtime.messages
        claude_session = headers.get("x-claude-code-session-id")  # read for these calls only
        if path == _COUNT_TOKENS:
            return await messages.count_tokens(body, context, claude_session)
        return await messages.create(body, context, claude_session)
    pipeline = runtime.pipeline
    if endpoint is not Endpoint.chat:
        return await pipeline.handle(endpoint, body, context)
    # Parsed here once, for the pipeline too: whether the request uses the legacy
    # `functions` fields is a look at its keys and its messages' (a scan of the raw
    # bytes cost 14.5 us on a 25 KB body, about 90 on a 50,000-token prompt).
    parsed = json_object(body)
    translated = to_tools(parsed)
    if translated is not None and translated[1]:  # asked with `functions`: answered so
        return await _legacy_functions(pipeline, translated[0], context)
    # A legacy history alone (`functions` and `tools` exclude each other) is sent as tool
    # calls, and beside custom tools too when the request declares any.
    rewritten = parsed if translated is None else translated[0]
    if (custom := to_functions(rewritten)) is not None:
        return await _custom_tools(pipeline, custom, context)
    if translated is None:
        return await pipeline.handle(endpoint, body, context, parsed=parsed)
    return await pipeline.handle(Endpoint.chat, rewritten, context)


async def _legacy_functions(
    pipeline: Pipeline, body: dict[str, Any], context: RequestContext
) -> Served:
    """A chat request that uses `functions` / `function_call`: sent with tools, and
    answered in the shape its client asked in (gateway/chat/legacy_functions.py)."""
    served = await pipeline.handle(Endpoint.chat, body, context)
    if served.stream is not None:
        return replace(served, stream=ConvertedEvents(function_call_events, served.stream))
    completion = to_function_call(served.completion())
    return Served(served.headers, orjson.dumps(completion), parsed=completion)


async def _custom_tools(
    pipeline: Pipeline, translated: tuple[dict[str, Any], frozenset[str]], context: RequestContext
) -> Served:
    """A chat request that declares `custom` tools: sent with them as functions, its calls
    of them answered as custom calls (gateway/chat/custom_tools.py)."""
    body, names = translated
    served = await pipeline.handle(Endpoint.chat, body, context)
    if served.stream is not None:
        return replace(served, stream=ConvertedEvents(custom_call_events(names), served.stream))
    completion = to_custom_calls(served.completion(), names)
    return Served(served.headers, orjson.dumps(completion), parsed=completion)


def render(served: Served) -> Response:
    """The gateway's answer as HTTP: a whole body, or a stream of server-sent events."""
    if served.stream is None:
        return Response(served.body, media_type=served.media_type, headers=served.headers)
    return EventStreamResponse(served.stream, served.headers)


class EventStreamResponse(StreamingResponse):
    """A stream of server-sent events that always closes its source, even if never
    iterated (a live stream holds a replica's slot until then)."""

    def __init__(self, stream: EventStream, headers: dict[str, str]) -> None:
        super().__init__(
            stream.sends(), media_type="text/event-stream", headers={**STREAM_HEADERS, **headers}
        )
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["type"] == "http" and _watch_for_disconnect(scope):
                await until_disconnect(self.stream_response(send), receive)
            else:  # the server raises on a send to a client that left: Starlette's way
                await super().__call__(scope, receive, send)
        finally:
            self.stream.close()


def _watch_for_disconnect(scope: Scope) -> bool:
    """Whether the server speaks ASGI before 2.4, whose `send` to a client that left
    returns quietly: then only `receive` tells (uvicorn says 2.3)."""
    spec = scope.get("asgi", {}).get("spec_version", "2.0")
    return tuple(map(int, spec.split("."))) < (2, 4)


async def until_disconnect(streaming: Coroutine[Any, Any, None], receive: Receive) -> None:
    """`streaming` run to its end, or cancelled when the client goes away first (which
    closes the stream's source: vLLM aborts a request whose connection is dropped).

    Starlette's StreamingResponse does the same for servers that speak ASGI before 2.4
    (uvicorn says 2.3) with an anyio task group per response: about 210 us of a streamed
    request's 1.1 ms here over streaming with no watcher at all (`make bench-hot-path
    --stream`). Here the stream runs in the caller's task and one task listens: a client
    that leaves cancels the caller, and that cancellation (only that one) ends the call
    quietly. Whatever ends first, the listener does not outlive the call."""
    task = asyncio.current_task()
    assert task is not None
    streaming_now, left = True, False

    def client_left(listener: asyncio.Task[None]) -> None:
        # Runs from the loop, so possibly after the stream ended: then it is too late.
        nonlocal left
        if streaming_now and not listener.cancelled():  # a disconnect, or `receive` failed
            left = True
            task.cancel()

    listener = asyncio.get_running_loop().create_task(_disconnected(receive))
    listener.add_done_callback(client_left)
    try:
        await streaming
    except asyncio.CancelledError:
        # Quiet only when the client's leaving was the one cancellation asked for.
        if not left or task.uncancel() > 0:
            raise
    else:
        if left:  # the stream caught the cancellation and ended: it is not the caller's
            task.uncancel()
    finally:
        streaming_now = False
        listener.cancel()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
