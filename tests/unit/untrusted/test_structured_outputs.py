"""vLLM's `structured_outputs` field: what a client asks the engine to compile is held to
the bounds a response-format schema is held to, a 400 naming the field before any engine
is asked; constraints within them pass untouched."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.chat.inbound import parse_request
from gateway.errors import InvalidRequest
from gateway.policy import Endpoint
from gateway.untrusted.schemas import MAX_PATTERN_CHARS, MAX_SCHEMA_NODES
from gateway.untrusted.structured_outputs import MAX_GRAMMAR_CHARS
from tests.fakes import FakeUpstream

CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "pick"}]}
HUGE_ENUM = {"enum": [f"v{i}" for i in range(100_000)]}  # 61 s of the engine's compile


def refused(body: dict[str, Any], endpoint: Endpoint = Endpoint.chat) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(endpoint, orjson.dumps(body))
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("constraint", "param", "code"),
    [
        ({"json": HUGE_ENUM}, "structured_outputs.json", "unsupported_schema"),
        ({"json": orjson.dumps(HUGE_ENUM).decode()}, "structured_outputs.json", "unsupported_schema"),
        ({"json": "{not json"}, "structured_outputs.json", "invalid_schema"),
        ({"json": {"$ref": "http://169.254.169.254/schema.json"}}, "structured_outputs.json", "unsupported_schema"),
        ({"regex": "|".join(f"w{i}x" for i in range(40_000))}, "structured_outputs.regex", "constraint_too_large"),
        ({"json_object": True, "whitespace_pattern": " " * (MAX_PATTERN_CHARS + 1)}, "structured_outputs.whitespace_pattern", "constraint_too_large"),
        ({"grammar": "root ::= " + '"a" ' * MAX_GRAMMAR_CHARS}, "structured_outputs.grammar", "constraint_too_large"),
        ({"structural_tag": "x" * (MAX_GRAMMAR_CHARS + 1)}, "structured_outputs.structural_tag", "constraint_too_large"),
        ({"choice": [str(i) for i in range(MAX_SCHEMA_NODES + 1)]}, "structured_outputs.choice", "constraint_too_large"),
        ({"choice": ["x" * 40_000, "y" * 40_000]}, "structured_outputs.choice", "constraint_too_large"),
    ],
)  # fmt: skip
def test_a_constraint_past_the_bounds_is_refused_naming_it(
    constraint: dict[str, Any], param: str, code: str
) -> None:
    for endpoint, body in (
        (Endpoint.chat, CHAT),
        (Endpoint.completions, {"model": "m", "prompt": "pick"}),
    ):
        error = refused({**body, "structured_outputs": constraint}, endpoint)
        assert (error.param, error.code) == (param, code)


def test_constraints_within_the_bounds_pass_untouched() -> None:
    for constraint in (
        {"json": {"enum": [f"v{i}" for i in range(9_990)]}},  # 0.16 s of the engine's
        {"json": '{"type": "object", "properties": {"a": {"type": "integer"}}}'},
        {"json": True},
        {"regex": "(one two three four ){12}"},
        {"regex": "a" * MAX_PATTERN_CHARS},
        {"grammar": 'root ::= "yes" | "no"'},
        {"choice": ["yes", "no"]},
        {"json_object": True, "disable_any_whitespace": True},
        {"regex": 7},  # the engine's to refuse
    ):
        body = {**CHAT, "structured_outputs": constraint}
        request = parse_request(Endpoint.chat, orjson.dumps(body))
        assert request.body["structured_outputs"] == constraint


def test_a_structural_tag_response_format_is_bounded_too() -> None:
    tag = {"type": "structural_tag", "structures": [], "triggers": ["x" * MAX_GRAMMAR_CHARS]}
    error = refused({**CHAT, "response_format": tag})
    assert (error.param, error.code) == ("response_format", "constraint_too_large")
    small = {"type": "structural_tag", "structures": [], "triggers": ["<tool>"]}
    assert parse_request(Endpoint.chat, orjson.dumps({**CHAT, "response_format": small}))


def test_the_app_refuses_before_the_engine_and_passes_what_is_bounded(
    gateway: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = gateway
    body = {**CHAT, "model": "tiny", "structured_outputs": {"json": HUGE_ENUM}}
    for stream in (False, True):
        response = client.post("/v1/chat/completions", json={**body, "stream": stream})
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            "structured_outputs.json",
            "unsupported_schema",
        )
    assert fake.calls == []
    bounded = {**CHAT, "model": "tiny", "structured_outputs": {"choice": ["v7", "v8"]}}
    assert client.post("/v1/chat/completions", json=bounded).status_code == 200
    (call,) = fake.calls
    assert orjson.loads(call.body)["structured_outputs"] == {"choice": ["v7", "v8"]}
