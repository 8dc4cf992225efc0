"""The policy's analyzers on argument values (`tool_calls.tools.<name>.arguments`), applied
to a call whose arguments already passed the tool's schema.

Each rule names one argument by JSON pointer. A string value is matched against the
rule's RE2 allow and deny lists; a code-carrying one (`language`) is parsed by its own
language's parser and classified by what it does (gateway/toolcalls/analyzers/), and
the rule's `effects` map says allow, deny or hold. The strictest verdict of all rules wins
(deny, then hold, then allow), with the reasons that led to it: the agent is told a
denial's reason, a reviewer sees a hold's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.policy.tool_calls import ArgumentRule, ToolRules, Verdict
from gateway.toolcalls.analyzers import analyze
from gateway.untrusted.regex import LinearRegex

_ORDER: dict[Verdict, int] = {"allow": 0, "hold": 1, "deny": 2}
_MISSING = object()


@dataclass(frozen=True)
class Ruling:
    verdict: Verdict
    reasons: tuple[str, ...] = ()


ALLOWED = Ruling("allow")


class CompiledRules:
    """One tool's rules, their patterns compiled once (at policy load)."""

    def __init__(self, rules: ToolRules) -> None:
        self._rules = [
            (
                rule,
                _pointer(rule.pointer),
                [LinearRegex(p) for p in rule.allow],
                [LinearRegex(p) for p in rule.deny],
            )
            for rule in rules.arguments
        ]

    def rule(self, arguments: dict[str, Any]) -> Ruling:
        verdict: Verdict = "allow"
        reasons: list[str] = []
        for rule, path, allow, deny in self._rules:
            value = _resolve(arguments, path)
            if value is _MISSING:
                continue
            for found, why in _judge(rule, value, allow, deny):
                if _ORDER[found] > _ORDER[verdict]:
                    verdict, reasons = found, [why]
                elif found == verdict and found != "allow":
                    reasons.append(why)
        return Ruling(verdict, tuple(reasons)) if verdict != "allow" else ALLOWED


def _judge(
    rule: ArgumentRule, value: Any, allow: list[LinearRegex], deny: list[LinearRegex]
) -> list[tuple[Verdict, str]]:
    where = rule.pointer
    if not isinstance(value, str):
        if allow or deny or rule.language:
            return [("deny", f"`{where}` must be a string to be checked")]
        return []
    found: list[tuple[Verdict, str]] = []
    for pattern in deny:
        if pattern.search(value):
            found.append(("deny", f"`{where}` matches the denied pattern {pattern.pattern!r}"))
    if allow and not any(pattern.search(value) for pattern in allow):
        found.append(("deny", f"`{where}` matches none of the allowed patterns"))
    if rule.language is not None:
        analysis = analyze(rule.language, value)
        for effect in sorted(analysis.effects):
            verdict: Verdict = rule.effects.get(
                effect,
                "deny" if effect == "unparsable" else "allow",
            )
            if verdict != "allow":
                detail = "; ".join(analysis.findings[:3]) or effect
                found.append((verdict, f"`{where}` ({rule.language}) {effect}: {detail}"))
    return found


def _pointer(pointer: str) -> tuple[str, ...]:
    """RFC 6901: `~1` is `/`, `~0` is `~`."""
    if not pointer:
        return ()
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/"))


def _resolve(value: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value
