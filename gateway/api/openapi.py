"""The gateway's own OpenAPI 3.2 document, served at `GET /openapi.json` (3.2: it
describes server-sent event streams, `itemSchema`).

FastAPI's generated schema is off (`openapi_url=None` in gateway/app.py): the API calls
agents make are answered in plain ASGI ahead of FastAPI (gateway/api/inference.py), so it would
describe neither them nor the OpenAI-shaped error every route answers with. This document is
written by hand for what the gateway itself promises: every route, its parameters, the
statuses it answers with and the shape of its answers. Fields the engine owns are left open
(its answer passes through); request bodies follow OpenAI's published schemas in the
fields the gateway reads, and accept every other field (it is passed to the engine).

tests/unit/api/test_fuzz_openapi.py fuzzes the app against this document with schemathesis and
checks that every route the app serves is described here.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.responses import JSONResponse

from gateway.api import openapi_admin
from gateway.api.openapi_schemas import SCHEMAS, ref

_JSON = "application/json"
_SSE = "text/event-stream"


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {_JSON: {"schema": schema}}}


def _header(description: str, kind: str = "string") -> dict[str, Any]:
    return {"description": description, "schema": {"type": kind}}


# On every 429; the x-ratelimit-* ones (OpenAI's) when a rate limit applies (gateway/quota/),
# and then on admitted answers too.
_RATE_LIMIT_HEADERS = {
    "Retry-After": _header("Whole seconds to wait, at least 1.", "integer"),
    "x-ratelimit-limit-requests": _header("Requests per minute allowed.", "integer"),
    "x-ratelimit-remaining-requests": _header("Requests left now.", "integer"),
    "x-ratelimit-reset-requests": _header("Until the request limit is full again, e.g. 6s."),
    "x-ratelimit-limit-tokens": _header("Tokens per minute allowed.", "integer"),
    "x-ratelimit-remaining-tokens": _header("Tokens left now.", "integer"),
    "x-ratelimit-reset-tokens": _header("Until the token limit is full again, e.g. 6m0s."),
}


def _errors(*statuses: int, shape: str = "Error") -> dict[str, Any]:
    reasons = {
        400: "The request is malformed or over a policy limit (`error.param` names the field).",
        401: "No valid API key (when the policy sets `auth.keys_file`).",
        403: "The key's roles do not allow this (deciding an approval needs `approver`).",
        404: "Unknown model, session, response or route.",
        409: "The approval was decided already, or expired; the fork's `session_id` names a "
        "session that exists (`session_exists`).",
        413: "The body is larger than `limits.max_body_bytes` (or the tenant's own).",
        422: "The engine refused the request (its own 4xx is passed on).",
        429: "Every replica is at capacity (`overloaded`), a rate limit is reached "
        "(`rate_limit_exceeded`), the tenant's budget is spent (type `insufficient_quota`, "
        "code `budget_exceeded`), or its stored conversations hold `limits.stored_bytes` "
        "(`stored_bytes_exceeded`: requests that would store more); `Retry-After` says when "
        "to try again.",
        502: "The engine failed or its answer failed the request's checks.",
        503: "No healthy replica, or the state store is unreachable.",
        504: "The engine did not answer in time.",
        529: "Every replica is at capacity (the Messages API's `overloaded_error`; the "
        "OpenAI routes answer 429); `Retry-After` says when to try again.",
    }
    return {
        str(status): {
            "description": reasons[status],
            **({"headers": _RATE_LIMIT_HEADERS} if status == 429 else {}),
            **_json_body(ref(shape)),
        }
        for status in statuses
    }


def _anthropic_call(summary: str, request: str, answer: str, *, streams: bool) -> dict[str, Any]:
    """An operation of the Anthropic Messages API: its errors in Anthropic's shape."""
    operation = _call(summary, request, answer, streams=streams)
    operation["post"]["responses"].update(_errors(*_CALL_ERRORS, 529, shape="AnthropicError"))
    operation["post"]["parameters"] = _SESSION_HEADERS[:1]
    operation["post"]["security"] = [{"bearer": []}, {"x-api-key": []}]
    return operation


_SESSION_PATTERN = "^[A-Za-z0-9._:@/+=-]{1,200}$"
_CALL_ERRORS = (400, 401, 404, 413, 422, 429, 502, 503, 504)
_READ_ERRORS = (400, 401, 404, 503)

_SESSION_HEADERS: list[dict[str, Any]] = [
    {
        "name": "X-Session-Id",
        "in": "header",
        "required": False,
        "description": "Names the session whose turns the gateway checkpoints.",
        "schema": {"type": "string", "pattern": _SESSION_PATTERN},
    },
    {
        "name": "X-Context-Mode",
        "in": "header",
        "required": False,
        "description": "`delta`: the body holds only the new messages of a session.",
        "schema": {"type": "string", "enum": ["full", "delta"]},
    },
    {
        "name": "X-Task",
        "in": "header",
        "required": False,
        "description": "A label the policy's tier rules can match.",
        "schema": {"type": "string"},
    },
]


def _path_id(name: str, description: str, pattern: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if pattern is not None:
        schema["pattern"] = pattern
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": schema,
    }


# `GET /v1/responses/{id}/input_items`'s paging, as OpenAI's.
_LIST_QUERY = [
    {"name": "limit", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}},
    {"name": "order", "in": "query", "required": False,
     "schema": {"type": "string", "enum": ["asc", "desc"], "default": "desc"}},
    {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}},
    {"name": "include", "in": "query", "required": False,
     "schema": {"type": "array", "items": {"type": "string"}}},
]  # fmt: skip

_SESSION_ID = _path_id(
    "session_id", "1-200 characters of letters, digits and . _ : @ / + = -.", _SESSION_PATTERN
)


def _call(summary: str, request: str, answer: str, *, streams: bool) -> dict[str, Any]:
    content: dict[str, Any] = {_JSON: {"schema": ref(answer)}}
    if streams:  # with `"stream": true`: server-sent events, as OpenAI's
        content[_SSE] = {"itemSchema": ref("ServerSentEvent")}
    return {
        "post": {
            "summary": summary,
            "parameters": _SESSION_HEADERS,
            "requestBody": {"required": True, **_json_body(ref(request))},
            "responses": {"200": {"description": "The answer.", "content": content}},
        }
    }


def _with_errors(operation: dict[str, Any], statuses: tuple[int, ...]) -> dict[str, Any]:
    for method in operation.values():
        method["responses"].update(_errors(*statuses))
    return operation


def _get(summary: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "summary": summary,
        "responses": {"200": {"description": "OK", **_json_body(schema)}},
        **extra,
    }


def _paths() -> dict[str, Any]:
    calls = {
        "/v1/chat/completions": _call(
            "Create a chat completion", "ChatCompletionRequest", "ChatCompletion", streams=True
        ),
        "/v1/completions": _call(
            "Create a completion", "CompletionRequest", "Completion", streams=True
        ),
        "/v1/embeddings": _call(
            "Create embeddings", "EmbeddingRequest", "EmbeddingList", streams=False
        ),
        "/v1/responses": _call("Create a response", "ResponseRequest", "Response", streams=True),
    }
    paths: dict[str, Any] = {path: _with_errors(op, _CALL_ERRORS) for path, op in calls.items()}
    paths["/v1/responses"]["post"]["parameters"] = []  # sessions come from previous_response_id
    paths["/v1/responses/input_tokens"] = _with_errors(
        _call(
            "Count a response's input tokens", "InputTokensRequest", "InputTokenCount",
            streams=False,
        ),
        _CALL_ERRORS,
    )  # fmt: skip
    paths["/v1/responses/input_tokens"]["post"]["parameters"] = []
    paths["/v1/responses/compact"] = _with_errors(
        _call("Compact a conversation", "CompactRequest", "CompactedResponse", streams=False),
        _CALL_ERRORS,
    )
    paths["/v1/responses/compact"]["post"]["parameters"] = []
    paths["/v1/messages"] = _anthropic_call(
        "Create a message (Anthropic)", "MessageRequest", "Message", streams=True
    )
    paths["/v1/messages/count_tokens"] = _anthropic_call(
        "Count a message's tokens (Anthropic)",
        "MessageCountTokensRequest",
        "MessageTokensCount",
        streams=False,
    )
    response_id = _path_id("response_id", "The id a created response answered with.")
    turn = {"name": "turn", "in": "path", "required": True, "schema": {"type": "integer"}}
    handle = _path_id("handle", "`m<message index>`, as compaction names an elided result.")
    reads: dict[str, dict[str, Any]] = {
        "/v1/responses/{response_id}": {
            "get": _get("Retrieve a stored response", ref("Response"), parameters=[response_id]),
            "delete": _get("Delete a stored response", ref("Deleted"), parameters=[response_id]),
        },
        "/v1/responses/{response_id}/input_items": {
            "get": _get(
                "The items a stored response was made from, those it continued included",
                ref("ResponseItemList"),
                parameters=[response_id, *_LIST_QUERY],
            )
        },
        "/v1/responses/{response_id}/cancel": {
            "post": _get(
                "Cancel a background response (every response here is answered in the "
                "foreground: a stored one is complete, and refused with a 400)",
                ref("Response"),
                parameters=[response_id],
            )
        },
        "/v1/models": {"get": _get("List the model aliases", ref("ModelList"))},
        "/v1/models/{model}": {
            "get": _get(
                "Retrieve a model alias",
                ref("Model"),
                parameters=[_path_id("model", "A model alias of the policy.")],
            )
        },
        "/v1/usage": {
            "get": _get(
                "Tokens, cost and savings per tenant, model and day, or of one session",
                ref("UsageReport"),
                parameters=[
                    {"name": name, "in": "query", "required": False, "schema": schema}
                    for name, schema in (
                        ("start", {"type": "string", "format": "date"}),
                        ("end", {"type": "string", "format": "date"}),
                        ("tenant", {"type": "string"}),
                        ("session", {"type": "string"}),
                    )
                ],
            )
        },
        "/v1/sessions/{session_id}": {
            "delete": _get("Delete a session", ref("Deleted"), parameters=[_SESSION_ID])
        },
        "/v1/sessions/{session_id}/checkpoints": {
            "get": _get(
                "List a session's checkpoints", ref("CheckpointList"), parameters=[_SESSION_ID]
            )
        },
        "/v1/sessions/{session_id}/checkpoints/{turn}": {
            "get": _get(
                "What the engine was sent at a turn, and why",
                ref("Checkpoint"),
                parameters=[_SESSION_ID, turn],
            )
        },
        "/v1/sessions/{session_id}/artifacts/{handle}": {
            "get": _get(
                "A tool result that compaction elided, whole",
                ref("Artifact"),
                parameters=[_SESSION_ID, handle],
            )
        },
        "/v1/sessions/{session_id}/fork": {
            "post": {
                "summary": "Fork a session from a checkpoint",
                "parameters": [_SESSION_ID],
                "requestBody": {"required": False, **_json_body(ref("ForkRequest"))},
                "responses": {
                    "201": {"description": "Created", **_json_body(ref("Session"))},
                    **_errors(409),
                },
            }
        },
    }
    for path, operations in reads.items():
        paths[path] = operations
        for operation in operations.values():
            statuses = (*_READ_ERRORS, 413) if "requestBody" in operation else _READ_ERRORS
            operation["responses"].update(_errors(*statuses))
    paths.update(_open_routes())
    paths.update(_approval_routes())
    paths.update(_feedback_routes())
    return paths


def _open_routes() -> dict[str, Any]:
    """Probes, metrics and the dashboard: no key needed."""
    ready = _get("Ready when every model has a healthy replica", ref("Status"))
    ready["responses"]["503"] = {"description": "Not ready", **_json_body(ref("Status"))}
    text = {"schema": {"type": "string"}}
    return {
        "/healthz": {"get": {**_get("Alive", ref("Status")), "security": []}},
        "/readyz": {"get": {**ready, "security": []}},
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "security": [],
                "responses": {"200": {"description": "OK", "content": {"text/plain": text}}},
            }
        },
        "/dashboard": {
            "get": {
                "summary": "The live dashboard page",
                "security": [],
                "responses": {"200": {"description": "OK", "content": {"text/html": text}}},
            }
        },
        "/dashboard/data": {
            "get": {**_get("The dashboard's figures", {"type": "object"}), "security": []}
        },
        "/openapi.json": {"get": {**_get("This document", {"type": "object"}), "security": []}},
    }


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.2.0",
        "info": {
            "title": "agent-gateway",
            "version": "1",
            "description": "OpenAI-compatible gateway for agent pipelines in front of vLLM. "
            "Every error is OpenAI's shape: "
            '`{"error": {"message", "type", "param", "code"}}`, but on the Anthropic Messages '
            'API (`/v1/messages...`): `{"type": "error", "error": {"type", "message"}}`.',
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        # The admin API (gateway/api/openapi_admin.py): its routes, schemas and own scheme.
        "paths": {**_paths(), **openapi_admin.paths(_path_id, _SESSION_PATTERN)},
        "components": {
            "schemas": {**SCHEMAS, **openapi_admin.SCHEMAS},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
                openapi_admin.SCHEME: openapi_admin.SECURITY_SCHEME,
            },
        },
    }


def build_openapi_router() -> APIRouter:
    router = APIRouter()
    document = openapi_document()  # built once: it describes code, not the policy

    @router.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(document)

    return router


_APPROVAL = {
    "type": "object",
    "description": "A held tool call (gateway/approvals/): the calls as the engine made "
    "them, the decision, and what happened, in `history`.",
    "required": ["id", "object", "status", "tool_calls", "created_at", "expires_at", "history"],
    "properties": {
        "id": {"type": "string", "pattern": "^apr_[0-9a-f]{24}$"},
        "object": {"const": "approval"},
        "status": {"enum": ["pending", "approved", "denied", "expired", "released"]},
        "model": {"type": "string"},
        "session_id": {"type": ["string", "null"]},
        "request_id": {"type": "string"},
        "trace_id": {"type": "string"},
        "tools": {"type": "array", "items": {"type": "string"}},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "content": {"type": ["string", "null"]},
        "created_at": {"type": "number"},
        "expires_at": {"type": "number"},
        "decided_by": {"type": ["string", "null"], "description": "The approver's key id."},
        "decided_at": {"type": ["number", "null"]},
        "reason": {"type": ["string", "null"]},
        "history": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["event", "at"],
                "properties": {"event": {"type": "string"}, "at": {"type": "number"}},
            },
        },
    },
}


def _approval_routes() -> dict[str, Any]:
    """Held tool calls and their decisions (gateway/api/approvals.py)."""
    approval_id = _path_id("approval_id", "The id a held call was answered with.")
    listing = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _APPROVAL}},
    }
    query = [
        {
            "name": "status",
            "in": "query",
            "required": False,
            "schema": {"enum": ["pending", "approved", "denied", "expired", "released"]},
        },
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": 100},
        },
    ]
    decision = {
        "type": "object",
        "required": ["decision"],
        "properties": {
            "decision": {"enum": ["approve", "deny"]},
            "reason": {"type": ["string", "null"], "maxLength": 1000},
        },
    }
    decided = {"description": "Decided", **_json_body(_APPROVAL)}
    decide = {
        "summary": "Approve or deny a held tool call (a key with the `approver` role)",
        "parameters": [approval_id],
        "requestBody": {"required": True, **_json_body(decision)},
        "responses": {"200": decided, **_errors(400, 401, 403, 404, 409, 413, 503)},
    }
    listed = _get("The tenant's approvals, newest first", listing, parameters=query)
    listed["responses"].update(_errors(400, 401, 503))
    one = _get("An approval, with its history", _APPROVAL, parameters=[approval_id])
    one["responses"].update(_errors(*_READ_ERRORS))
    return {
        "/v1/approvals": {"get": listed},
        "/v1/approvals/{approval_id}": {"get": one, "post": decide},
    }


def _feedback_routes() -> dict[str, Any]:
    """Scores for served requests (gateway/api/feedback.py)."""
    given = {
        "type": "object",
        "required": ["request_id", "score"],
        "additionalProperties": False,
        "properties": {
            "request_id": {
                "type": "string",
                "pattern": "^[A-Za-z0-9._:/=+-]{1,128}$",
                "description": "The X-Request-Id the gateway answered the request with.",
            },
            "score": {"type": ["number", "boolean"], "description": "Any finite number."},
            "name": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,64}$", "default": "user"},
            "comment": {"type": ["string", "null"], "maxLength": 4000},
        },
    }
    stored = {
        "type": "object",
        "required": ["object", "id", "request_id", "name", "score"],
        "properties": {
            "object": {"const": "feedback"},
            "id": {"type": "string"},
            "request_id": {"type": "string"},
            "name": {"type": "string"},
            "score": {"type": "number"},
            "comment": {"type": ["string", "null"]},
        },
    }
    post = {
        "summary": "Score a served request (kept under the caller's tenant)",
        "requestBody": {"required": True, **_json_body(given)},
        "responses": {
            "200": {"description": "Stored", **_json_body(stored)},
            **_errors(400, 401, 413, 503),
        },
    }
    return {"/v1/feedback": {"post": post}}
