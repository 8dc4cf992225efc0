"""Regexes and JSON Schemas a policy holds run on client content, so they load only when
RE2 can run them (linear time) and the schema is bounded: anything else is a load error
naming the key path and saying why."""

from __future__ import annotations

import pytest

from gateway.policy import PolicyError, parse_policy

POLICY = """\
version: 1
pools:
  chat: {served_model: tiny, replicas: [{url: "http://127.0.0.1:8001"}]}
models:
  tiny: {pool: chat}
  auto: {tiering: default}
tiering:
  default:
    tiers: {small: chat, large: chat}
    rules:
      - {name: cheap, when: {last_user_matches: 'yes|no'}, then: small}
    guardrails: {regex: '[a-z]+'}
canonicalize:
  volatile: {patterns: [{name: ticket, regex: 'T-[0-9]+'}, {name: date}]}
trimming:
  state_tools:
    get_order: {entity: order, id_field: id, schema: {type: object}}
"""


def problems(text: str) -> str:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text)
    return str(caught.value)


def test_the_patterns_and_schemas_load() -> None:
    policy = parse_policy(POLICY)
    guardrails = policy.tiering["default"].guardrails
    assert guardrails is not None and guardrails.compiled_regex is not None
    assert guardrails.compiled_regex.fullmatch("abc")
    state_tool = policy.trimming.state_tools["get_order"]
    assert state_tool.checked_schema is not None
    assert state_tool.checked_schema.first_error({"id": 1}) is None


@pytest.mark.parametrize(
    ("change", "path", "why"),
    [
        (
            ("last_user_matches: 'yes|no'", r"last_user_matches: '(a)\1'"),
            "tiering.default.rules[0].when.last_user_matches",
            r"not a valid regex: invalid escape sequence: \1",
        ),
        (
            ("regex: '[a-z]+'}", "regex: '(?=a)[a-z]+'}"),
            "tiering.default.guardrails.regex",
            "regex is not valid: invalid perl operator: (?=",
        ),
        (
            ("regex: 'T-[0-9]+'", "regex: '(?<!x)T-[0-9]+'"),
            "canonicalize.volatile.patterns[0].regex",
            "not a valid regex: invalid perl operator: (?<!",
        ),
        (
            (
                "guardrails: {regex: '[a-z]+'}",
                "guardrails: {json_schema: {$ref: 'http://x.test/s'}}",
            ),
            "tiering.default.guardrails.json_schema",
            "points outside the schema",
        ),
        (
            ("guardrails: {regex: '[a-z]+'}", "guardrails: {json_schema: {pattern: '(a)\\1'}}"),
            "tiering.default.guardrails.json_schema",
            "cannot be checked in linear time",
        ),
        (
            ("schema: {type: object}", "schema: {$ref: '#'}"),
            "trimming.state_tools.get_order.schema",
            "never end",
        ),
        (
            ("schema: {type: object}", "schema: {$ref: 'file:///etc/passwd'}"),
            "trimming.state_tools.get_order.schema",
            "points outside the schema",
        ),
    ],
)
def test_what_cannot_run_bounded_is_a_load_error_naming_the_path(
    change: tuple[str, str], path: str, why: str
) -> None:
    assert change[0] in POLICY
    message = problems(POLICY.replace(*change))
    assert path in message
    assert why in message
