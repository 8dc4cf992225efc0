"""Input hardening: the policy's `limits` (message and tool counts, JSON nesting depth, the
`max_tokens` ceiling, body size) answer 400/413 in OpenAI's shape naming the field, on the
chat, completions, embeddings and Responses paths, before any engine is asked; and no
request field makes the gateway connect anywhere but the policy's replicas."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.chat.inbound import parse_request
from gateway.errors import InvalidRequest
from gateway.policy import Endpoint, Policy, PolicyError, parse_policy
from gateway.policy.schema import LimitsSpec
from gateway.tenants.settings import TenantPolicies
from gateway.untrusted.json_depth import deeper_by_walk, depth_probe
from tests.fakes import Call, FakeUpstream, Scripted
from tests.policies import parse_with_redis
from tests.unit.clients import OpenGateways

LIMITS = LimitsSpec(max_messages=4, max_tools=2, max_json_depth=10, max_tokens=1000)
POLICY = """\
version: 1
limits: {max_body_bytes: 4000, max_messages: 4, max_tools: 2, max_json_depth: 10, max_tokens: 1000}
pools:
  chat:
    served_model: served-tiny
    serves: [chat, completions, embeddings]
    replicas: [{url: "http://a.test:1"}, {url: "http://b.test:1"}]
models:
  tiny: {pool: chat}
"""
USER = {"role": "user", "content": "hi"}
CHAT: dict[str, Any] = {"model": "tiny", "messages": [USER]}
COMPLETION = (
    b'{"id":"c1","object":"chat.completion","created":1,"model":"served-tiny",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"fine"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
)


def tool(name: str, parameters: Any = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def nested(levels: int) -> Any:
    """A value that is `levels` levels of arrays and objects deep."""
    value: Any = {}
    for i in range(levels - 1):
        value = [value] if i % 2 else {"x": value}
    return value


def refused(
    endpoint: Endpoint, body: dict[str, Any], limits: LimitsSpec = LIMITS
) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(endpoint, orjson.dumps(body), limits)
    assert caught.value.status == 400
    return caught.value


def test_messages_and_tools_up_to_the_limit_pass_and_one_more_is_refused() -> None:
    at_limit = {**CHAT, "messages": [USER] * 4, "tools": [tool("a"), tool("b")]}
    assert parse_request(Endpoint.chat, orjson.dumps(at_limit), LIMITS).model == "tiny"

    error = refused(Endpoint.chat, {**CHAT, "messages": [USER] * 5})
    assert (error.param, error.code) == ("messages", "array_above_max_length")
    assert error.message == (
        "Invalid 'messages': array too long. Expected an array with maximum length 4, "
        "but got an array with length 5 instead."
    )
    error = refused(Endpoint.chat, {**CHAT, "tools": [tool("a"), tool("b"), tool("c")]})
    assert (error.param, error.code) == ("tools", "array_above_max_length")


@pytest.mark.parametrize(
    ("endpoint", "field"),
    [
        (Endpoint.chat, "max_tokens"),
        (Endpoint.chat, "max_completion_tokens"),
        (Endpoint.completions, "max_tokens"),
    ],
)
def test_output_tokens_over_the_ceiling_are_refused_naming_the_field(
    endpoint: Endpoint, field: str
) -> None:
    body = {**CHAT, "prompt": "hi"} if endpoint is Endpoint.completions else dict(CHAT)
    assert parse_request(endpoint, orjson.dumps({**body, field: 1000}), LIMITS)
    error = refused(endpoint, {**body, field: 1001})
    assert (error.param, error.code) == (field, "max_tokens_too_large")
    assert "1001" in error.message and "1000" in error.message
    # Not a number: the engine's to refuse, as before.
    assert parse_request(endpoint, orjson.dumps({**body, field: "lots"}), LIMITS)


@pytest.mark.parametrize("endpoint", [Endpoint.chat, Endpoint.completions])
def test_n_over_the_limit_is_refused_naming_it(endpoint: Endpoint) -> None:
    """`n` multiplies the engine's work and the request's token estimate: bounded like
    `max_tokens`, in OpenAI's own words."""
    body = {**CHAT, "prompt": "hi"} if endpoint is Endpoint.completions else dict(CHAT)
    limits = LimitsSpec(max_n=4)
    assert parse_request(endpoint, orjson.dumps({**body, "n": 4}), limits)
    error = refused(endpoint, {**body, "n": 5}, limits)
    assert (error.param, error.code) == ("n", "integer_above_max_value")
    assert error.message == (
        "Invalid 'n': integer above maximum value. Expected a value <= 4, but got 5 instead."
    )
    for huge in (10**15, 1e15):
        assert refused(endpoint, {**body, "n": huge}, limits).param == "n"
    assert parse_request(endpoint, orjson.dumps({**body, "n": "lots"}), limits)  # the engine's


def test_best_of_is_bounded_like_n() -> None:
    """The legacy completions' `best_of` makes that many candidates to pick `n` from: the
    same multiplier of work, the same bound."""
    body = {**CHAT, "prompt": "hi"}
    limits = LimitsSpec(max_n=4)
    assert parse_request(Endpoint.completions, orjson.dumps({**body, "best_of": 4}), limits)
    error = refused(Endpoint.completions, {**body, "best_of": 10**15}, limits)
    assert (error.param, error.code) == ("best_of", "integer_above_max_value")


def test_n_is_at_most_16_unless_the_policy_or_a_tenant_says_otherwise() -> None:
    assert LimitsSpec().max_n == 16
    refused(Endpoint.chat, {**CHAT, "n": 17}, LimitsSpec())
    policy = parse_policy(
        POLICY.replace("max_tokens: 1000}", "max_tokens: 1000, max_n: 2}")
        + "tenants:\n  batch: {limits: {max_n: 128}}\n"
    )
    assert policy.limits.max_n == 2
    assert TenantPolicies(policy).of("batch").limits.max_n == 128
    with pytest.raises(PolicyError, match=r"limits\.max_n"):
        parse_policy(POLICY.replace("max_tokens: 1000}", "max_tokens: 1000, max_n: 0}"))


def test_nesting_up_to_the_limit_passes_and_deeper_is_refused_naming_the_field() -> None:
    # body (1) > tools (2) > tool (3) > function (4) > parameters (5): 6 more levels to 10.
    fits = {**CHAT, "tools": [tool("a", nested(6))]}
    assert parse_request(Endpoint.chat, orjson.dumps(fits), LIMITS)
    for name, body in [
        ("tools", {**CHAT, "tools": [tool("a", nested(7))]}),
        ("messages", {**CHAT, "messages": [{**USER, "content": [nested(8)]}]}),
        ("response_format", {**CHAT, "response_format": nested(10)}),
        ("x_vendor_field", {**CHAT, "x_vendor_field": nested(10)}),
    ]:
        error = refused(Endpoint.chat, body)
        assert (error.param, error.code) == (name, "json_too_deep"), name


def test_a_body_as_deep_as_orjson_parses_is_refused_without_recursion() -> None:
    deep = b'{"model": "tiny", "messages": [{"role": "user"}], "x": ' + b"[" * 1000 + b"]" * 1000
    for limits in (LIMITS, LimitsSpec()):
        with pytest.raises(InvalidRequest) as caught:
            parse_request(Endpoint.chat, deep + b"}", limits)
        assert (caught.value.param, caught.value.code) == ("x", "json_too_deep")
    deep_input = b'{"model": "tiny", "input": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    with pytest.raises(InvalidRequest) as caught:  # probed by orjson, not walked
        parse_request(Endpoint.embeddings, deep_input, LimitsSpec())
    assert (caught.value.param, caught.value.code) == ("input", "json_too_deep")
    # Past orjson's own ceiling (1,024 levels) the parser refuses: the same code.
    too_deep = b'{"model": "tiny", "input": ' + b"[" * 1100 + b"]" * 1100 + b"}"
    with pytest.raises(InvalidRequest) as caught:
        parse_request(Endpoint.embeddings, too_deep, LIMITS)
    assert caught.value.code == "json_too_deep"


@pytest.mark.parametrize("limit", [8, 10, 64, 128])
def test_the_walk_and_the_orjson_probe_agree_at_every_depth(limit: int) -> None:
    probe = depth_probe(limit)
    assert probe is not None  # orjson has its ceiling: the cheap path is the one in use
    for depth in range(1, limit + 4):
        for value in (nested(depth), [nested(depth - 1)] if depth > 1 else []):
            too_deep = depth + 1 > limit  # a top-level field of depth d reaches level d + 1
            assert deeper_by_walk(value, 2, limit) is too_deep, (limit, depth)
            assert probe.deeper(value) is too_deep, (limit, depth)
            assert probe.deeper(value) is too_deep  # the reused chain is left clean


def test_wide_bodies_are_not_deep() -> None:
    wide = {**CHAT, "metadata": {f"k{i}": [1, 2, {"a": "b"}] for i in range(2000)}}
    assert parse_request(Endpoint.chat, orjson.dumps(wide), LIMITS)


def test_the_defaults_are_far_above_what_agents_send() -> None:
    limits = LimitsSpec()
    assert (limits.max_messages, limits.max_tools) == (2048, 256)
    assert (limits.max_json_depth, limits.max_tokens) == (64, 131_072)


def test_limits_are_validated_at_load() -> None:
    base = POLICY.split("limits:")[0]
    rest = POLICY.split("\n", 2)[2]
    with pytest.raises(PolicyError, match=r"limits\.max_json_depth"):
        parse_policy(base + "limits: {max_json_depth: 300}\n" + rest)
    with pytest.raises(PolicyError, match=r"limits\.max_tools"):
        parse_policy(base + "limits: {max_tools: 0}\n" + rest)
    with pytest.raises(PolicyError, match=r"limits\.max_tool_count"):
        parse_policy(base + "limits: {max_tool_count: 3}\n" + rest)


# -- through the app --------------------------------------------------------------------


@pytest.fixture
def policy(redis_url: str) -> Policy:
    return parse_with_redis(POLICY, redis_url)


def answered(call: Call) -> Scripted:
    if b'"stream":true' in call.body:
        chunks = [
            b'data: {"choices":[{"index":0,"delta":{"content":"fine"}}]}\n\n',
            b"data: [DONE]\n\n",
        ]
        return Scripted(chunks=chunks, content_type="text/event-stream")
    return Scripted(body=COMPLETION)


@pytest.fixture
def gateway(policy: Policy) -> Iterator[tuple[TestClient, FakeUpstream]]:
    gateways = OpenGateways()
    yield gateways.open(policy, answered)
    gateways.close_all()


def error_of(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    assert error["type"] == "invalid_request_error"
    return error


REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [  # path, body, param, code
    ("/v1/chat/completions", {**CHAT, "messages": [USER] * 5}, "messages", "array_above_max_length"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 5000}, "max_tokens", "max_tokens_too_large"),
    ("/v1/chat/completions", {**CHAT, "tools": [tool("a", nested(9))]}, "tools", "json_too_deep"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 1001}, "max_tokens", "max_tokens_too_large"),
    ("/v1/embeddings", {"model": "tiny", "input": nested(12)}, "input", "json_too_deep"),
    ("/v1/responses", {"model": "tiny", "input": [USER] * 5}, "input", "array_above_max_length"),
    ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 1001}, "max_output_tokens", "max_tokens_too_large"),
    ("/v1/responses", {"model": "tiny", "input": "hi", "tools": [{"type": "function", "name": "f"}] * 3}, "tools", "array_above_max_length"),
    ("/v1/responses", {"model": "tiny", "input": "hi", "metadata": nested(10)}, "metadata", "json_too_deep"),
]  # fmt: skip


def test_the_app_answers_a_limit_with_a_400_and_never_asks_the_engine(
    gateway: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = gateway
    for path, body, param, code in REFUSALS:
        response = client.post(path, json=body)
        assert response.status_code == 400, (path, param)
        error = error_of(response)
        assert (error["param"], error["code"]) == (param, code), (path, param)
    assert fake.calls == []
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_bodies_over_the_size_limit_get_413_on_every_route(
    gateway: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = gateway
    big = orjson.dumps({**CHAT, "pad": "x" * 5000})
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/sessions/s1/fork"):
        response = client.post(path, content=big, headers={"Content-Type": "application/json"})
        assert response.status_code == 413, path
        assert error_of(response)["code"] == "request_too_large"
        assert response.headers["x-request-id"]
    assert fake.calls == []

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(5):
            yield b" " * 1000

    session = f"limits-{uuid.uuid4().hex[:8]}"
    assert client.post("/v1/chat/completions", json=CHAT, headers={"X-Session-Id": session})
    response = client.post(f"/v1/sessions/{session}/fork", content=chunks())
    assert response.status_code == 413
    assert error_of(response)["code"] == "request_too_large"
    assert client.post(f"/v1/sessions/{session}/fork", json={}).status_code == 201


def test_no_request_field_or_header_chooses_where_the_gateway_connects(
    gateway: tuple[TestClient, FakeUpstream],
) -> None:
    """Fields and headers that steer other proxies (LiteLLM's `api_base`, the OpenAI SDK's
    `base_url`, `extra_body`, Host/X-Forwarded-Host) are passed to the engine as data at
    most: every connection goes to a replica the policy names, and the client's
    Authorization header never travels upstream."""
    client, fake = gateway
    steering = {
        "base_url": "http://evil.test:9/v1",
        "api_base": "http://evil.test:9",
        "url": "http://evil.test:9/v1/chat/completions",
        "extra_body": {"base_url": "http://evil.test:9", "api_base": "http://evil.test:9"},
        "extra_headers": {"Host": "evil.test"},
        "metadata": {"endpoint": "http://evil.test:9"},
    }
    headers = {
        "Authorization": "Bearer sk-client-key-0123456789",
        "Host": "evil.test",
        "X-Forwarded-Host": "evil.test",
        "X-Forwarded-Proto": "https",
        "Forwarded": "host=evil.test",
    }
    for path, body in [
        ("/v1/chat/completions", {**CHAT, **steering}),
        ("/v1/chat/completions", {**CHAT, **steering, "stream": True}),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", **steering}),
        ("/v1/embeddings", {"model": "tiny", "input": "hi", **steering}),
        ("/v1/responses", {"model": "tiny", "input": "hi", **steering}),
    ]:
        client.post(path, json=body, headers=headers)
    replicas = ("http://a.test:1/v1/", "http://b.test:1/v1/")
    assert len(fake.calls) >= 5
    for call in fake.calls:
        assert call.url.startswith(replicas), call.url
        assert "evil" not in str(call.headers)
        assert {name.lower() for name in call.headers}.isdisjoint({"authorization", "host"})
