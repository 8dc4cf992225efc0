"""Tier rules: each matcher alone, conjunctions, order, and the facts they read."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.policy import parse_policy
from gateway.policy.tiering import RuleWhen, TierRule
from gateway.tiering.rules import (
    MATCHERS,
    Rules,
    facts_of,
    policy_fixed_tier,
    response_format_kinds,
)


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": "Is this spam?"}], **extra}


def enum_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def first(when: dict[str, Any], request: dict[str, Any], task: str | None = None) -> str | None:
    rules = Rules([TierRule(name="r", when=RuleWhen(**when), then="small")])
    rule = rules.first_match(facts_of(request, task_header=task))
    return rule.name if rule else None


@pytest.mark.parametrize(
    ("when", "request_body", "task", "matched"),
    [
        ({"task": ("classify", "extract")}, body(), "Classify", True),
        ({"task": ("classify",)}, body(metadata={"task": "classify"}), None, True),
        ({"task": ("classify",)}, body(), "plan", False),
        ({"task": ("classify",)}, body(), None, False),
        ({"tools": "absent"}, body(), None, True),
        ({"tools": "present"}, body(), None, False),
        (
            {"tools": "present"},
            body(tools=[{"type": "function", "function": {"name": "f"}}]),
            None,
            True,
        ),
        (
            {"response_format": ("enum",)},
            body(response_format=enum_format({"type": "string", "enum": ["a", "b"]})),
            None,
            True,
        ),
        (
            {"response_format": ("enum",)},
            body(
                response_format=enum_format(
                    {"type": "object", "properties": {"label": {"enum": ["a", "b"]}}}
                )
            ),
            None,
            True,
        ),
        (
            {"response_format": ("enum",)},
            body(
                response_format=enum_format(
                    {"type": "object", "properties": {"a": {"type": "string"}}}
                )
            ),
            None,
            False,
        ),
        (
            {"response_format": ("small_object",)},
            body(
                response_format=enum_format(
                    {
                        "type": "object",
                        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                    }
                )
            ),
            None,
            True,
        ),
        (
            {"response_format": ("small_object",)},
            body(
                response_format=enum_format(
                    {"type": "object", "properties": {"a": {"type": "array"}}}
                )
            ),
            None,
            False,
        ),
        (
            {"response_format": ("json_object",)},
            body(response_format={"type": "json_object"}),
            None,
            True,
        ),
        ({"response_format": ("text",)}, body(), None, True),
        ({"max_tokens_at_most": 16}, body(max_tokens=8), None, True),
        ({"max_tokens_at_most": 16}, body(max_completion_tokens=8), None, True),
        ({"max_tokens_at_most": 16}, body(max_tokens=64), None, False),
        ({"max_tokens_at_most": 16}, body(), None, False),
        ({"prompt_tokens_at_most": 100}, body(), None, True),
        (
            {"prompt_tokens_at_most": 100},
            {"messages": [{"role": "user", "content": "x" * 2000}]},
            None,
            False,
        ),
        ({"last_user_matches": r"(?i)\bspam\b"}, body(), None, True),
        ({"last_user_matches": r"(?i)\bplan\b"}, body(), None, False),
        ({"task": ("classify",), "tools": "absent"}, body(), "classify", True),
        ({"task": ("classify",), "tools": "present"}, body(), "classify", False),
    ],
)
def test_each_matcher(
    when: dict[str, Any], request_body: dict[str, Any], task: str | None, matched: bool
) -> None:
    assert (first(when, request_body, task) == "r") is matched


def test_the_first_matching_rule_decides() -> None:
    rules = Rules([
        TierRule(name="long", when=RuleWhen(prompt_tokens_at_most=1), then="large"),
        TierRule(name="spam", when=RuleWhen(last_user_matches="spam"), then="small"),
        TierRule(name="any", when=RuleWhen(tools="absent"), then="large"),
    ])  # fmt: skip
    rule = rules.first_match(facts_of(body()))
    assert rule is not None
    assert (rule.name, rule.tier) == ("spam", "small")


def test_content_parts_are_read_as_text() -> None:
    request = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a spam"}]}]}
    assert facts_of(request).last_user == "a spam"


def test_every_field_of_when_has_a_matcher_and_every_matcher_a_field() -> None:
    assert MATCHERS.keys() == RuleWhen.model_fields.keys()


def test_a_rule_without_matchers_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one matcher"):
        RuleWhen()


def test_formats_without_a_schema_are_text() -> None:
    assert response_format_kinds(None, 4) == {"text"}
    assert response_format_kinds({"type": "json_schema"}, 4) == {"json_schema"}


def test_route_eval_reads_the_policy_rules_as_small_or_large() -> None:
    policy = parse_policy("""\
version: 1
pools:
  s: {served_model: s, replicas: [{url: "http://s.test:1"}]}
  l: {served_model: l, replicas: [{url: "http://l.test:1"}]}
models:
  auto: {tiering: default}
tiering:
  default:
    tiers: {small: s, large: l}
    rules:
      - {name: yes-no, when: {last_user_matches: "^(Is|Does) "}, then: small}
      - {name: proofs, when: {last_user_matches: "(?i)prove"}, then: large}
""")
    fixed = policy_fixed_tier(policy)
    assert fixed is not None
    assert fixed("Is 7 prime?") == "small"
    assert fixed("Prove that 7 is prime.") == "large"
    assert fixed("What is 7?") is None
