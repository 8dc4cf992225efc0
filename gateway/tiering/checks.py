"""Deterministic checks of an answer: JSON Schema, enum, regex, "parses as" JSON or Python.

The checks of a request are its JSON-schema `response_format` plus the route's guardrails.
Where the engine can, the gateway asks it to produce a conforming answer (vLLM structured
outputs) instead of hoping; the answer is checked either way, because a constrained answer
can still be cut short by `max_tokens`.

Schemas and regexes are checked with the bounded validator and RE2 of gateway/untrusted/:
the client's schema was prepared (and refused with a 400) when the request was parsed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.chat.inbound import RESPONSE_SCHEMA_PARAM, response_format_schema
from gateway.chat.messages import Message
from gateway.errors import InvalidRequest
from gateway.policy.tiering import GuardrailSpec
from gateway.untrusted.regex import LinearRegex
from gateway.untrusted.schemas import ClientSchema, TooCostly


class _NotJson:
    def __init__(self, reason: str) -> None:
        self.reason = reason


_UNPARSED = object()


@dataclass(frozen=True)
class OutputChecks:
    response_schema: ClientSchema | None = None  # from the request's response_format
    guardrail_schema: ClientSchema | None = None
    enum: tuple[str, ...] | None = None
    regex: LinearRegex | None = None
    parses_as: str | None = None

    @property
    def names(self) -> list[str]:
        named = {
            "response_format": self.response_schema,
            "json_schema": self.guardrail_schema,
            "enum": self.enum,
            "regex": self.regex,
            "parses_as": self.parses_as,
        }
        return [name for name, value in named.items() if value is not None]

    def problems(self, reply: Message | None) -> list[tuple[str, str]]:
        """(check, what is wrong) for each failed check; an empty list passes. A reply that
        calls tools is not a final answer, so there is nothing to check yet."""
        if reply is not None and reply.get("tool_calls"):
            return []
        content = reply.get("content") if reply is not None else None
        text = content if isinstance(content, str) else ""
        found: list[tuple[str, str]] = []
        parsed: Any = _UNPARSED
        for check, schema in (
            ("response_format", self.response_schema),
            ("json_schema", self.guardrail_schema),
        ):
            if schema is None:
                continue
            if parsed is _UNPARSED:
                parsed = _json_or_error(text)
            if isinstance(parsed, _NotJson):
                found.append((check, parsed.reason))
            elif (error := _schema_error(check, schema, parsed)) is not None:
                found.append((check, error))
        if self.enum is not None and text.strip() not in self.enum:
            found.append(("enum", f"{_short(text)} is not one of {list(self.enum)}"))
        if self.regex is not None and not self.regex.fullmatch(text.strip()):
            found.append(("regex", f"{_short(text)} does not match {self.regex.pattern!r}"))
        if self.parses_as == "json" and isinstance(reason := _json_or_error(text), _NotJson):
            found.append(("parses_as", reason.reason))
        if self.parses_as == "python":
            try:
                ast.parse(_unfenced(text))
            except (SyntaxError, ValueError) as exc:
                found.append(("parses_as", f"not Python: {exc.__class__.__name__}: {exc}"))
        return found

    def constrain(self, body: dict[str, Any], engine_can: bool) -> dict[str, Any]:
        """The body to send: with a structured-output request where the engine can honour
        one, and without the client's JSON-schema response_format where it cannot (the
        answer is checked here instead)."""
        if not engine_can:
            if self.response_schema is not None:
                return {k: v for k, v in body.items() if k != "response_format"}
            return body
        if self.response_schema is not None or "structured_outputs" in body:
            return body  # the engine already constrains to the client's schema
        if self.guardrail_schema is not None:
            schema = {"name": "guardrail", "schema": self.guardrail_schema.document}
            return {**body, "response_format": {"type": "json_schema", "json_schema": schema}}
        if self.enum is not None:
            return {**body, "structured_outputs": {"choice": list(self.enum)}}
        if self.regex is not None:
            return {**body, "structured_outputs": {"regex": self.regex.pattern}}
        if self.parses_as == "json" and "response_format" not in body:
            return {**body, "response_format": {"type": "json_object"}}
        return body


def checks_for(
    guardrails: GuardrailSpec | None,
    body: dict[str, Any],
    response_schema: ClientSchema | None = None,
) -> OutputChecks | None:
    """The checks a request's answer must pass, or None when there are none.
    `response_schema`: the body's, prepared when the request was parsed; prepared here
    (a 400 when refused) when not given."""
    if response_schema is None:
        response_schema = response_format_schema(body.get("response_format"))
    if guardrails is None and response_schema is None:
        return None
    spec = guardrails or GuardrailSpec()
    checks = OutputChecks(
        response_schema=response_schema,
        guardrail_schema=spec.checked_schema,
        enum=spec.enum,
        regex=spec.compiled_regex,
        parses_as=spec.parses_as,
    )
    return checks if checks.names else None


def _json_or_error(text: str) -> Any:
    # Strict: a client parses the answer as it comes, so a Markdown fence is a failure.
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return _NotJson(f"not JSON: {exc}")


def _schema_error(check: str, schema: ClientSchema, value: Any) -> str | None:
    try:
        return schema.first_error(value)
    except TooCostly as exc:
        if check == "response_format":  # the client's schema: theirs to simplify
            raise InvalidRequest(
                f"The answer could not be checked against `{RESPONSE_SCHEMA_PARAM}`: {exc}. "
                "Simplify the schema or ask for a shorter answer.",
                param=RESPONSE_SCHEMA_PARAM,
                code="schema_too_costly",
            ) from None
        return f"too costly to check: {exc}"  # the policy's: the answer is not vouched for


def _unfenced(text: str) -> str:
    """Models often wrap JSON or code in a Markdown fence; the check reads inside it."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```") and len(stripped) > 6:
        inner = stripped[3:-3]
        newline = inner.find("\n")
        return inner[newline + 1 :] if newline >= 0 else inner
    return stripped


def _short(text: str, limit: int = 60) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "…")
