"""vLLM's own `structured_outputs` field: constraints a client asks the engine to compile,
bounded as the gateway bounds a `json_schema` response format.

vLLM takes a JSON Schema, a regex, a grammar, a list of choices or a structural tag in a
request's `structured_outputs` and compiles it (xgrammar) before the first token. The
gateway already refuses a response-format schema past its bounds (gateway/untrusted/
schemas.py) because the engine compiles it too; through this field the same schema went
to the engine unbounded. Measured on a `cpu-tiny` replica (`python -m
tests.bench.constraint_compile`, 2026-12-07): an `enum` of 100,000 values (1 MB) took 67 s,
20,000 required properties 15 s, a 640 KB grammar 4.9 s, and a regex of 40,000
alternatives made the engine answer 500 after 5.6 s; within the bounds below each took at
most 1.7 s (an enum of 9,990 values; a 16 KB regex 0.10 s, a 50 KB grammar 0.23 s, 10,000
choices 0.52 s). Past a bound the request is a 400 naming the field, before any engine is
asked:

- `json` (an object, or a JSON text, which must parse): the response format's bounds,
  `prepare`'s (`invalid_schema`, `unsupported_schema`);
- `regex`, `whitespace_pattern`: `MAX_PATTERN_CHARS`, as for a schema's patterns;
- `grammar`, `structural_tag`, and a `structural_tag` response format:
  `MAX_GRAMMAR_CHARS`;
- `choice`: `MAX_SCHEMA_NODES` choices, `MAX_GRAMMAR_CHARS` characters in all.

Everything else about the field (which keys, their types, one constraint at a time) is
the engine's to judge, and its 400 reaches the client as before.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.untrusted.schemas import MAX_PATTERN_CHARS, MAX_SCHEMA_NODES, UnsafeSchema, prepare

MAX_GRAMMAR_CHARS = 65_536
_PARAM = "structured_outputs"
_PATTERNS = ("regex", "whitespace_pattern")
_GRAMMARS = ("grammar", "structural_tag")


def check_structured_outputs(body: dict[str, Any]) -> None:
    spec = body.get(_PARAM)
    if isinstance(spec, dict):
        _check_json(spec.get("json"))
        for key in _PATTERNS:
            _bounded(spec.get(key), MAX_PATTERN_CHARS, f"{_PARAM}.{key}")
        for key in _GRAMMARS:
            _bounded(spec.get(key), MAX_GRAMMAR_CHARS, f"{_PARAM}.{key}")
        _check_choice(spec.get("choice"))
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "structural_tag":
        text = orjson.dumps(response_format)  # rare: only this kind is measured
        _bounded_length(len(text), MAX_GRAMMAR_CHARS, "response_format")


def _check_json(schema: Any) -> None:
    param = f"{_PARAM}.json"
    if isinstance(schema, str):  # JSON text: read as the engine would, then bounded
        try:
            schema = orjson.loads(schema)
        except orjson.JSONDecodeError:  # not JSON, or nested past orjson's 1,024 levels
            raise InvalidRequest(
                f"Invalid schema in '{param}': not a JSON text.",
                param=param,
                code="invalid_schema",
            ) from None
    if not isinstance(schema, dict | bool):
        return
    try:
        prepare(schema)
    except UnsafeSchema as exc:
        raise InvalidRequest(
            f"Invalid schema in '{param}': {exc.reason}.", param=param, code=exc.code
        ) from None


def _check_choice(choices: Any) -> None:
    if not isinstance(choices, list):
        return
    param = f"{_PARAM}.choice"
    if len(choices) > MAX_SCHEMA_NODES:
        raise InvalidRequest(
            f"Invalid '{param}': at most {MAX_SCHEMA_NODES:,} choices, got {len(choices):,}.",
            param=param,
            code="constraint_too_large",
        )
    chars = sum(len(choice) for choice in choices if isinstance(choice, str))
    _bounded_length(chars, MAX_GRAMMAR_CHARS, param)


def _bounded(value: Any, limit: int, param: str) -> None:
    if isinstance(value, str):
        _bounded_length(len(value), limit, param)


def _bounded_length(length: int, limit: int, param: str) -> None:
    if length > limit:
        raise InvalidRequest(
            f"Invalid '{param}': at most {limit:,} characters for the engine to compile, "
            f"got {length:,}.",
            param=param,
            code="constraint_too_large",
        )
