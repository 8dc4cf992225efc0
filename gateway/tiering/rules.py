"""Ordered tier rules: facts read off a request once, and one small predicate per matcher.

A rule's `when` is a conjunction; the first rule whose matchers all hold decides the tier.
Facts are cheap to compute (no tokenizer: prompt tokens are estimated at 4 bytes a token,
which is what a size threshold needs) and are the same for the gateway and `route-eval`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.policy import Policy
from gateway.policy.tiering import RuleWhen, TierRule
from gateway.untrusted.regex import LinearRegex

_BYTES_PER_TOKEN = 4
_SCALARS = frozenset({"string", "number", "integer", "boolean", "null"})


@dataclass(frozen=True)
class RequestFacts:
    task: str | None
    has_tools: bool
    formats: frozenset[str]  # response_format kinds, see `response_format_kinds`
    max_tokens: int | None
    prompt_tokens: int
    last_user: str


def facts_of(
    body: Mapping[str, Any], *, task_header: str | None = None, small_object_fields: int = 4
) -> RequestFacts:
    messages = body.get("messages") or ()
    metadata = body.get("metadata")
    task = task_header or (metadata.get("task") if isinstance(metadata, dict) else None)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    return RequestFacts(
        task=task.strip().lower() if isinstance(task, str) and task.strip() else None,
        has_tools=bool(body.get("tools")),
        formats=response_format_kinds(body.get("response_format"), small_object_fields),
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        prompt_tokens=_estimated_tokens(messages, body.get("tools")),
        last_user=last_user_text(messages),
    )


def last_user_text(messages: Sequence[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _estimated_tokens(messages: Sequence[Any], tools: Any) -> int:
    size = sum(len(content_text(m.get("content"))) + 16 for m in messages if isinstance(m, dict))
    if isinstance(tools, list):
        size += sum(len(str(tool)) for tool in tools)
    return size // _BYTES_PER_TOKEN


def response_format_kinds(response_format: Any, small_object_fields: int) -> frozenset[str]:
    """`text`, `json_object`, or `json_schema` plus `enum` (the answer is one of a list:
    a classification) and/or `small_object` (a few scalar fields: an extraction)."""
    if not isinstance(response_format, dict):
        return frozenset({"text"})
    kind = response_format.get("type")
    if kind == "json_object":
        return frozenset({"json_object"})
    if kind != "json_schema":
        return frozenset({"text"})
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    kinds = {"json_schema"}
    if isinstance(schema, dict):
        if _is_enum(schema):
            kinds.add("enum")
        properties = schema.get("properties")
        if schema.get("type") == "object" and isinstance(properties, dict):
            fields = list(properties.values())
            if len(fields) == 1 and isinstance(fields[0], dict) and _is_enum(fields[0]):
                kinds.add("enum")
            if len(fields) <= small_object_fields and all(
                isinstance(f, dict) and (_is_enum(f) or f.get("type") in _SCALARS) for f in fields
            ):
                kinds.add("small_object")
    return frozenset(kinds)


def _is_enum(schema: dict[str, Any]) -> bool:
    return isinstance(schema.get("enum"), list) or "const" in schema


Matcher = Callable[[RequestFacts], bool]


def _task(tasks: tuple[str, ...]) -> Matcher:
    wanted = frozenset(t.lower() for t in tasks)
    return lambda f: f.task in wanted


def _tools(presence: str) -> Matcher:
    wanted = presence == "present"
    return lambda f: f.has_tools == wanted


def _response_format(kinds: tuple[str, ...]) -> Matcher:
    wanted = frozenset(kinds)
    return lambda f: bool(f.formats & wanted)


def _max_tokens_at_most(limit: int) -> Matcher:
    return lambda f: f.max_tokens is not None and f.max_tokens <= limit


def _prompt_tokens_at_most(size: int) -> Matcher:
    return lambda f: f.prompt_tokens <= size


def _last_user_matches(regex: str) -> Matcher:
    pattern = LinearRegex(regex)  # RE2: linear in the client's text
    return lambda f: pattern.search(f.last_user)


# One matcher per field of a rule's `when` (gateway/policy/tiering.py), by the field's
# name: a new matcher is a field there and a line here (a test holds the two together).
MATCHERS: dict[str, Callable[[Any], Matcher]] = {
    "task": _task,
    "tools": _tools,
    "response_format": _response_format,
    "max_tokens_at_most": _max_tokens_at_most,
    "prompt_tokens_at_most": _prompt_tokens_at_most,
    "last_user_matches": _last_user_matches,
}


def _matchers(when: RuleWhen) -> list[Matcher]:
    """The given fields' matchers, in the fields' order."""
    return [MATCHERS[name](value) for name, value in when.__dict__.items() if value is not None]


@dataclass(frozen=True)
class CompiledRule:
    name: str
    tier: str
    matchers: tuple[Matcher, ...]

    def matches(self, facts: RequestFacts) -> bool:
        return all(match(facts) for match in self.matchers)


class Rules:
    def __init__(self, rules: Sequence[TierRule]) -> None:
        self._rules = [CompiledRule(r.name, r.then, tuple(_matchers(r.when))) for r in rules]

    def first_match(self, facts: RequestFacts) -> CompiledRule | None:
        return next((rule for rule in self._rules if rule.matches(facts)), None)


def policy_fixed_tier(policy: Policy) -> Callable[[str], str | None] | None:
    """For `route-eval --policy`: the tier the rules of the policy's first tiering give a
    bare prompt, as `small` (its lowest tier) or `large` (its highest), else None."""
    if not policy.tiering:
        return None
    spec = next(iter(policy.tiering.values()))
    rules = Rules(spec.rules)
    labels = {spec.lowest: "small", spec.highest: "large"}

    def fixed(prompt: str) -> str | None:
        body = {"messages": [{"role": "user", "content": prompt}]}
        rule = rules.first_match(facts_of(body, small_object_fields=spec.small_object_fields))
        return labels.get(rule.tier) if rule is not None else None

    return fixed
