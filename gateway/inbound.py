"""Inbound OpenAI request bodies: parsed once, checked just enough to route and to name
the offending field. The engine validates the rest and its 4xx answers reach the client
unchanged; every field the gateway does not own is passed through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.policy import Endpoint

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(frozen=True)
class InboundRequest:
    endpoint: Endpoint
    raw: bytes | None  # the client's bytes; None once the gateway has rewritten the body
    body: dict[str, Any]
    model: str
    stream: bool

    def with_body(self, body: dict[str, Any]) -> InboundRequest:
        return replace(self, raw=None, body=body)

    def body_for(self, served_model: str) -> bytes:
        """The bytes to send upstream: the client's own, unless something had to change."""
        if served_model == self.model and self.raw is not None:
            return self.raw
        return orjson.dumps({**self.body, "model": served_model})


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object; a 400 naming the problem otherwise."""
    if not raw.strip():
        raise InvalidRequest(
            "The request body is empty; expected a JSON object.", code="invalid_json"
        )
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    return body


def parse_request(endpoint: Endpoint, raw: bytes) -> InboundRequest:
    body = json_object(raw)
    model = body.get("model")
    _require(body, "model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            "`model` must be a non-empty string.", param="model", code="invalid_type"
        )

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("`stream` must be a boolean.", param="stream", code="invalid_type")
    if endpoint is Endpoint.embeddings and stream:
        raise InvalidRequest("Embeddings cannot be streamed.", param="stream", code="invalid_value")

    if endpoint is Endpoint.chat:
        _check_messages(body)
        _check_tools(body)
    elif endpoint is Endpoint.completions:
        _require(body, "prompt")
    else:
        _require(body, "input")
    _check_stream_options(body, stream)
    return InboundRequest(endpoint, raw, body, model, stream)


def _require(body: dict[str, Any], name: str) -> None:
    if name not in body or body[name] is None:
        raise InvalidRequest(
            f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
        )


def _check_messages(body: dict[str, Any]) -> None:
    _require(body, "messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise InvalidRequest("`messages` must be an array.", param="messages", code="invalid_type")
    if not messages:
        raise InvalidRequest(
            "`messages` must contain at least one message.", param="messages", code="empty_array"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(
                f"`messages[{i}]` must be an object.", param=f"messages[{i}]", code="invalid_type"
            )
        role = message.get("role")
        if role is None:
            raise InvalidRequest(
                f"Missing required parameter: 'messages[{i}].role'.",
                param=f"messages[{i}].role",
                code="missing_required_parameter",
            )
        if not isinstance(role, str) or role not in _ROLES:
            raise InvalidRequest(
                f"Invalid value for 'messages[{i}].role': {role!r}. "
                f"Supported values are: {', '.join(sorted(_ROLES))}.",
                param=f"messages[{i}].role",
                code="invalid_value",
            )


def _check_tools(body: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise InvalidRequest("`tools` must be an array.", param="tools", code="invalid_type")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            raise InvalidRequest(
                f"Missing required parameter: 'tools[{i}].function'.",
                param=f"tools[{i}].function",
                code="missing_required_parameter",
            )
        if not isinstance(function.get("name"), str):
            raise InvalidRequest(
                f"Missing required parameter: 'tools[{i}].function.name'.",
                param=f"tools[{i}].function.name",
                code="missing_required_parameter",
            )


def _check_stream_options(body: dict[str, Any], stream: bool) -> None:
    options = body.get("stream_options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise InvalidRequest(
            "`stream_options` must be an object.", param="stream_options", code="invalid_type"
        )
    if not stream:
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
            code="invalid_value",
        )
