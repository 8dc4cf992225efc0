"""A policy's regexes run on what clients and engines write: the guardrail regex on every
answer, a rule's `last_user_matches` on every prompt. Both run with RE2, so a pattern that
backtracks in Python's `re` (`(a+)+b`: exponential in the `a`s) costs linear time."""

from __future__ import annotations

from gateway.policy.tiering import GuardrailSpec, RuleWhen, TierRule
from gateway.tiering.checks import checks_for
from gateway.tiering.rules import Rules, facts_of
from tests.unit.deadline import deadline

EVIL = "a" * 10_000 + "c"  # Python's `re` needs ~2^10000 steps on `(a+)+b` here


def test_a_backtracking_guardrail_regex_checks_an_answer_in_linear_time() -> None:
    checks = checks_for(GuardrailSpec(regex="(a+)+b"), {})
    assert checks is not None
    with deadline():
        failed = checks.problems({"role": "assistant", "content": EVIL})
    assert [check for check, _ in failed] == ["regex"]


def test_a_backtracking_rule_regex_reads_a_prompt_in_linear_time() -> None:
    rules = Rules([TierRule(name="r", when=RuleWhen(last_user_matches="^(a+)+b$"), then="s")])
    body = {"messages": [{"role": "user", "content": EVIL}]}
    with deadline():
        assert rules.first_match(facts_of(body)) is None
