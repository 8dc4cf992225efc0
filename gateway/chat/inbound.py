"""Inbound OpenAI request bodies: parsed once, checked just enough to route and to name
the offending field. The engine validates the rest and its 4xx answers reach the client
unchanged; every field the gateway does not own is passed through untouched.

The policy's `limits` (message and tool counts, JSON nesting depth, the `max_tokens` and
`n` ceilings) are checked here, in the same pass, so nothing later on the request path (the
canonicalizer's recursive key sort, orjson re-serialising the body, the session store)
ever meets a body a working agent would not send. So are media URLs, which the engine
would fetch (gateway/untrusted/media_urls.py).

A `json_schema` response format is prepared here too (gateway/untrusted/schemas.py): a
schema the gateway will not apply (a reference outside it, a loop, too large, a pattern
RE2 cannot run) is a 400 before any engine is asked, whether or not the gateway checks
the answer, since the engine compiles it as well; and so are the same constraints asked
through vLLM's own `structured_outputs` field (gateway/untrusted/structured_outputs.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.policy import Endpoint
from gateway.policy.schema import LimitsSpec
from gateway.untrusted.json_depth import deeper_by_walk, depth_probe
from gateway.untrusted.media_urls import check_media_urls
from gateway.untrusted.schemas import ClientSchema, UnsafeSchema, prepare
from gateway.untrusted.structured_outputs import check_structured_outputs

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_CONTAINERS = frozenset({dict, list})
_NUMBERS = frozenset({int, float})
_DEFAULT_LIMITS = LimitsSpec()
RESPONSE_SCHEMA_PARAM = "response_format.json_schema.schema"
# The output-token fields each endpoint takes (the Responses API's are checked by
# gateway/responses/service.py before its body becomes a chat request).
_TOKEN_FIELDS = {
    Endpoint.chat: ("max_tokens", "max_completion_tokens"),
    Endpoint.completions: ("max_tokens",),
    Endpoint.embeddings: (),
}


@dataclass(frozen=True)
class InboundRequest:
    endpoint: Endpoint
    raw: bytes | None  # the client's bytes; None once the gateway has rewritten the body
    body: dict[str, Any]
    model: str
    stream: bool
    # The `json_schema` response format's schema, prepared; kept across body rewrites.
    response_schema: ClientSchema | None = None

    def with_body(self, body: dict[str, Any]) -> InboundRequest:
        # Built directly, not by `dataclasses.replace` (a third of the cost, on every
        # request); the cached properties below are of the old body and are not carried.
        return InboundRequest(
            self.endpoint, None, body, self.model, self.stream, self.response_schema
        )

    @functools.cached_property
    def size(self) -> int:
        """The body's size in bytes: as the client sent it, or as it is sent upstream."""
        return len(self.raw) if self.raw is not None else len(self.body_for(self.model))

    @functools.cached_property
    def messages_json(self) -> bytes | None:
        """The body's `messages`, serialised once: prefix hashing reads it, and the engine's
        body reuses it instead of serialising a long conversation a second time."""
        messages = self.body.get("messages")
        return orjson.dumps(messages) if isinstance(messages, list) else None

    def output_capped(self, context_tokens: int | None) -> dict[str, int]:
        """The output-token fields (`max_tokens`, `max_completion_tokens`) that ask for more
        than the engine's whole context window, each brought down to it: an upper bound the
        engine could never reach, which vLLM refuses with a 400 (`max_tokens=32000 cannot be
        greater than max_model_len=16384`: Claude Code's default against a 16K engine)
        and, brought down, serves with what the prompt leaves. Empty when nothing asks more."""
        if context_tokens is None:
            return {}
        body = self.body
        return {
            name: context_tokens
            for name in _TOKEN_FIELDS[self.endpoint]
            if type(value := body.get(name)) is int and value > context_tokens
        }

    def body_for(self, served_model: str, changed: dict[str, int] | None = None) -> bytes:
        """The bytes to send upstream: the client's own, unless something had to change
        (the served model's name, the fields in `changed`)."""
        if served_model == self.model and self.raw is not None and not changed:
            return self.raw
        fields: dict[str, Any] = {"model": served_model, **(changed or {})}
        messages = self.messages_json  # prefix hashing has usually serialised it already
        if messages is None:
            return orjson.dumps({**self.body, **fields})
        others = {key: value for key, value in self.body.items() if key != "messages"}
        rest = orjson.dumps({**others, **fields})  # never empty: has the model
        return b'{"messages":' + messages + b"," + rest[1:]


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object; a 400 naming the problem otherwise."""
    if not raw.strip():
        raise InvalidRequest(
            "The request body is empty; expected a JSON object.", code="invalid_json"
        )
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson refuses nesting past 1,024 levels itself: the same answer as a body past
        # the policy's own depth limit.
        code = "json_too_deep" if "depth limit" in str(exc) else "invalid_json"
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc}", code=code
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    return body


def parse_request(
    endpoint: Endpoint,
    raw: bytes | dict[str, Any],
    limits: LimitsSpec = _DEFAULT_LIMITS,
    *,
    parsed: dict[str, Any] | None = None,
) -> InboundRequest:
    """The client's bytes, or a body the gateway built from another API's request (the
    Responses API's), checked against the policy's limits. `parsed`: the client's bytes
    as `json_object` parsed them already."""
    client_bytes = raw if isinstance(raw, bytes) else None
    body = parsed if parsed is not None else json_object(raw) if isinstance(raw, bytes) else raw
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
        _check_messages(body, limits.max_messages)
        _check_tools(body, limits.max_tools)
    elif endpoint is Endpoint.completions:
        _require(body, "prompt")
    else:
        _require(body, "input")
    if isinstance(messages := body.get("messages"), list):  # embeddings may carry them too
        check_media_urls(messages, limits.media_url_hosts)  # the engine would fetch them
    _check_stream_options(body, stream)
    check_depth(body, limits.max_json_depth, walk="messages")
    check_max_tokens(body, _TOKEN_FIELDS[endpoint], limits.max_tokens)
    if endpoint is not Endpoint.embeddings:
        check_n(body, limits.max_n)
    response_schema = response_format_schema(body.get("response_format"))
    if endpoint is not Endpoint.embeddings:
        check_structured_outputs(body)  # vLLM's own constraints field, compiled by the engine
    return InboundRequest(endpoint, client_bytes, body, model, stream, response_schema)


def response_format_schema(
    response_format: Any, param: str = RESPONSE_SCHEMA_PARAM
) -> ClientSchema | None:
    """The schema of a `json_schema` response format, prepared; None for other formats
    and for a schema that is not an object (the engine names that mistake itself)."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return client_schema(schema, param) if isinstance(schema, dict) else None


def client_schema(schema: dict[str, Any], param: str) -> ClientSchema:
    """A client's JSON Schema prepared to check values against; a 400 naming `param`
    (`invalid_schema` or `unsupported_schema`) when the gateway will not apply it."""
    try:
        return prepare(schema)
    except UnsafeSchema as exc:
        raise InvalidRequest(
            f"Invalid schema in '{param}': {exc.reason}.", param=param, code=exc.code
        ) from None


def check_array_length(value: list[Any], limit: int, param: str) -> None:
    """A 400 in OpenAI's own words and code when an array is over the policy's limit."""
    if len(value) > limit:
        raise InvalidRequest(
            f"Invalid '{param}': array too long. Expected an array with maximum length "
            f"{limit}, but got an array with length {len(value)} instead.",
            param=param,
            code="array_above_max_length",
        )


def check_depth(body: dict[str, Any], limit: int, *, walk: str | None = None) -> None:
    """A 400 naming the top-level field whose arrays and objects nest past `limit` levels
    (the body itself is level 1). Never recursive, whatever the depth.

    `walk` names the field holding the conversation (`messages`, or the Responses API's
    `input`): long text in few containers, cheapest walked. Every other field (tool
    schemas, response formats, token arrays) is probed by orjson (gateway/untrusted/json_depth.py).
    """
    probe = depth_probe(limit)
    for name, value in body.items():
        if type(value) not in _CONTAINERS:
            continue
        if probe is None or name == walk:
            too_deep = deeper_by_walk(value, 2, limit)
        else:
            too_deep = probe.deeper(value)
        if too_deep:
            raise InvalidRequest(
                f"`{name}` nests arrays and objects deeper than this gateway allows: "
                f"{limit} levels, counting the request body as level 1.",
                param=name,
                code="json_too_deep",
            )


def check_max_tokens(body: dict[str, Any], fields: tuple[str, ...], ceiling: int) -> None:
    """A 400 when the client asks for more output tokens than the policy allows; values
    that are not numbers are the engine's to refuse."""
    for name in fields:
        value: Any = body.get(name)
        if type(value) in _NUMBERS and value > ceiling:  # bool is no number here
            raise InvalidRequest(
                f"`{name}` is too large: {value}. This gateway allows at most {ceiling}.",
                param=name,
                code="max_tokens_too_large",
            )


def check_n(body: dict[str, Any], ceiling: int) -> None:
    """A 400 in OpenAI's words when the client asks for more choices than the policy
    allows: `n` (and the legacy completions' `best_of`, the candidates the engine makes to
    pick `n` from) multiplies the engine's work and the token estimate rate limits charge
    (gateway/quota/estimate.py). Values that are not numbers are the engine's to refuse."""
    for name in ("n", "best_of"):
        value: Any = body.get(name)
        if type(value) in _NUMBERS and value > ceiling:  # bool is no number here
            raise InvalidRequest(
                f"Invalid '{name}': integer above maximum value. Expected a value <= "
                f"{ceiling}, but got {value} instead.",
                param=name,
                code="integer_above_max_value",
            )


def _require(body: dict[str, Any], name: str) -> None:
    if name not in body or body[name] is None:
        raise InvalidRequest(
            f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter"
        )


def _check_messages(body: dict[str, Any], limit: int) -> None:
    _require(body, "messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise InvalidRequest("`messages` must be an array.", param="messages", code="invalid_type")
    if not messages:
        raise InvalidRequest(
            "`messages` must contain at least one message.", param="messages", code="empty_array"
        )
    check_array_length(messages, limit, "messages")
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
        if role == "assistant" and (calls := message.get("tool_calls")) is not None:
            _check_tool_calls(calls, f"messages[{i}].tool_calls")


def _check_tool_calls(calls: Any, param: str) -> None:
    """An assistant message's calls are read by the gateway itself (sessions, trimming,
    re-asks), not only by the engine: each must be an object, its `function` one too."""
    if not isinstance(calls, list):
        raise InvalidRequest(f"`{param}` must be an array.", param=param, code="invalid_type")
    for j, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("function", {}), dict):
            where = f"{param}[{j}]" if not isinstance(call, dict) else f"{param}[{j}].function"
            raise InvalidRequest(f"`{where}` must be an object.", param=where, code="invalid_type")
        if call.get("type") == "custom":  # left as it came: no custom tool is declared
            raise InvalidRequest(
                f"`{param}[{j}]` calls a custom tool, and the request's `tools` declare none: "
                "declare the custom tools a conversation has called (the engine is offered "
                "them as functions, and the history's calls with them).",
                param=f"{param}[{j}]",
                code="invalid_value",
            )


def _check_tools(body: dict[str, Any], limit: int) -> None:
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise InvalidRequest("`tools` must be an array.", param="tools", code="invalid_type")
    check_array_length(tools, limit, "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):  # custom tools are functions by now
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
