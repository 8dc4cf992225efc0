"""Answer checks: JSON Schema (the request's and the route's), enum, regex, parses-as; and
the structured-output request made where the engine can honour one."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.policy.tiering import GuardrailSpec
from gateway.tiering.checks import OutputChecks, checks_for

LABEL = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["spam", "ham"]}},
    "required": ["label"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "label", "schema": LABEL}}


def reply(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def failed(checks: OutputChecks, text: str) -> list[str]:
    return [check for check, _ in checks.problems(reply(text))]


def test_a_request_without_checks_has_none() -> None:
    assert checks_for(None, {"messages": []}) is None
    assert checks_for(None, {"response_format": {"type": "json_object"}}) is None


def test_the_response_format_schema_is_checked() -> None:
    checks = checks_for(None, {"response_format": FORMAT})
    assert checks is not None
    assert failed(checks, '{"label": "spam"}') == []
    assert failed(checks, '{"label": "eggs"}') == ["response_format"]
    assert failed(checks, "spam") == ["response_format"]
    assert failed(checks, '```json\n{"label": "spam"}\n```') == ["response_format"]
    _, why = checks.problems(reply('{"label": "eggs"}'))[0]
    assert "label" in why
    assert "eggs" in why


def test_an_invalid_client_schema_is_a_400_naming_the_field() -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}
    with pytest.raises(InvalidRequest) as refused:
        checks_for(None, {"response_format": bad})
    assert refused.value.status == 400
    assert refused.value.param == "response_format.json_schema.schema"
    assert refused.value.code == "invalid_schema"
    assert "`type`" in refused.value.message


@pytest.mark.parametrize(
    ("spec", "good", "bad", "check"),
    [
        (GuardrailSpec(enum=("yes", "no")), " yes\n", "maybe", "enum"),
        (GuardrailSpec(regex=r"[A-Z]{3}-\d{4}"), "ABC-1234", "abc-1234!", "regex"),
        (GuardrailSpec(parses_as="json"), '[1, 2, {"a": null}]', "{'a': 1}", "parses_as"),
        (
            GuardrailSpec(parses_as="python"),
            "```python\ndef f(x):\n    return x\n```",
            "def f(:",
            "parses_as",
        ),
        (GuardrailSpec(json_schema={"type": "integer"}), "42", "4.5", "json_schema"),
    ],
)
def test_guardrails(spec: GuardrailSpec, good: str, bad: str, check: str) -> None:
    checks = checks_for(spec, {"messages": []})
    assert checks is not None
    assert failed(checks, good) == []
    assert failed(checks, bad) == [check]


def test_a_reply_calling_tools_is_not_checked_yet() -> None:
    checks = checks_for(GuardrailSpec(enum=("yes",)), {})
    assert checks is not None
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert checks.problems({"role": "assistant", "tool_calls": [call]}) == []
    assert failed(checks, "") == ["enum"]
    assert [c for c, _ in checks.problems(None)] == ["enum"]


def test_a_guardrail_schema_must_be_a_schema() -> None:
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        GuardrailSpec(json_schema={"type": "nonsense"})


@pytest.mark.parametrize(
    ("spec", "request_body", "expected"),
    [
        (GuardrailSpec(enum=("a", "b")), {}, {"structured_outputs": {"choice": ["a", "b"]}}),
        (GuardrailSpec(regex="x+"), {}, {"structured_outputs": {"regex": "x+"}}),
        (
            GuardrailSpec(json_schema={"type": "integer"}),
            {},
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "guardrail", "schema": {"type": "integer"}},
                }
            },
        ),
        (GuardrailSpec(parses_as="json"), {}, {"response_format": {"type": "json_object"}}),
        (GuardrailSpec(parses_as="python"), {}, {}),
        # The client's own constraint stays the one the engine enforces.
        (GuardrailSpec(enum=("a",)), {"response_format": FORMAT}, {"response_format": FORMAT}),
        (
            GuardrailSpec(enum=("a",)),
            {"structured_outputs": {"regex": "a"}},
            {"structured_outputs": {"regex": "a"}},
        ),
    ],
)
def test_engines_that_can_are_asked_to_constrain(
    spec: GuardrailSpec, request_body: dict[str, Any], expected: dict[str, Any]
) -> None:
    checks = checks_for(spec, request_body)
    assert checks is not None
    assert checks.constrain(request_body, engine_can=True) == expected


def test_engines_that_cannot_get_no_schema_and_the_gateway_checks() -> None:
    request_body = {"messages": [], "response_format": FORMAT}
    checks = checks_for(None, request_body)
    assert checks is not None
    assert checks.constrain(request_body, engine_can=False) == {"messages": []}
