"""A tool's `parameters` schema, made ready to check the arguments of every call to it.

Tool schemas are small and plain: every keyword in the 30 tau-bench tools and the 120
BFCL tools is one of `type`, `properties`, `required`, `items`, `enum`, `description`,
`default`. The bounded `jsonschema` validator (gateway/untrusted/schemas.py) checks them
at 24 us per call at the median but 306 us at the p99 (tau-bench's `book_reservation`:
each keyword evaluation costs ~12 us), past this checker's budget of 200 us a call. So a
schema made only of the keywords below is compiled to plain Python checks (p99 under
20 us on the same calls); a schema with any other keyword anywhere, or a value the plain
checks cannot judge exactly, goes to the bounded validator as before. The verdicts of
both agree on every tau-bench and BFCL call, clean and with seeded faults
(tests/unit/toolcalls/test_arguments_schema.py compares them).

One keyword is the gateway's own: `x-grammar`, a Lark grammar a custom tool's input must
follow (gateway/chat/custom_tools.py), which only the plain checks apply (JSON Schema has
no such keyword, so the bounded validator takes it for an annotation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.untrusted.lark_grammars import GRAMMAR_KEYWORD, UnusableGrammar, lark_grammar
from gateway.untrusted.schemas import ClientSchema, TooCostly, prepare

# Keywords the plain checks apply exactly as JSON Schema 2020-12 does, and annotations
# that assert nothing. (`format` is an annotation in 2020-12 unless a checker asserts it,
# as the bounded validator does not.)
_ANNOTATIONS = frozenset(
    {
        "description",
        "title",
        "default",
        "examples",
        "$comment",
        "format",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_APPLIED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        GRAMMAR_KEYWORD,
    }
)
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "string": lambda v: type(v) is str,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "number": lambda v: type(v) in (int, float),
    # JSON Schema counts 1.0 as an integer; bool is never a number
    "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
}
_MAX_PLAIN_DEPTH = 16  # deeper schemas go to the bounded validator, which bounds its work

# A check: the problem with a value at a path, or None.
Check = Callable[[Any, str], str | None]


class _Unsupported(Exception):
    """The schema uses something the plain checks do not apply exactly."""


@dataclass(frozen=True)
class ArgumentsSchema:
    """`first_error(arguments)`: what is wrong (`<path>: <message>`), or None."""

    bounded: ClientSchema
    plain: Check | None  # None: every value goes to the bounded validator

    def first_error(self, value: Any) -> str | None:
        """`TooCostly` when the bounded validator gives up (as ClientSchema.first_error)."""
        if self.plain is not None:
            return self.plain(value, "")
        return self.bounded.first_error(value)

    @property
    def document(self) -> dict[str, Any] | bool:
        return self.bounded.document


def prepare_arguments(schema: Any) -> ArgumentsSchema:
    """`UnsafeSchema` (from the bounded preparation) when the schema is refused."""
    bounded = prepare(schema)
    try:
        plain = _compile(schema, 0)
    except _Unsupported:
        plain = None
    return ArgumentsSchema(bounded, plain)


def _compile(schema: Any, depth: int) -> Check:
    if schema is True or schema == {}:
        return lambda value, path: None
    if not isinstance(schema, dict) or depth > _MAX_PLAIN_DEPTH:
        raise _Unsupported
    unknown = schema.keys() - _APPLIED - _ANNOTATIONS
    if unknown:
        raise _Unsupported
    checks: list[Check] = []
    if "type" in schema:
        checks.append(_type_check(schema["type"]))
    if "enum" in schema:
        checks.append(_enum_check(schema["enum"]))
    for keyword, measure, kind in (
        ("minLength", len, "string"),
        ("maxLength", len, "string"),
        ("minItems", len, "array"),
        ("maxItems", len, "array"),
    ):
        if keyword in schema:
            checks.append(_size_check(keyword, schema[keyword], measure, kind))
    for keyword in ("minimum", "maximum"):
        if keyword in schema:
            checks.append(_bound_check(keyword, schema[keyword]))
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        checks.append(_object_check(schema, depth))
    if "items" in schema:
        checks.append(_items_check(_compile(schema["items"], depth + 1)))
    if GRAMMAR_KEYWORD in schema and (grammar := _grammar_check(schema[GRAMMAR_KEYWORD])):
        checks.append(grammar)
    if len(checks) == 1:
        return checks[0]

    def all_of(value: Any, path: str) -> str | None:
        for check in checks:
            if (problem := check(value, path)) is not None:
                return problem
        return None

    return all_of


def _grammar_check(grammar: Any) -> Check | None:
    """A string's Lark grammar (`x-grammar`, as a custom tool's input carries it:
    gateway/chat/custom_tools.py), matched with a bound; None for anything else under the
    keyword, which asserts nothing then (a grammar that does not compile included: a
    custom tool's was refused with a 400 already)."""
    if not isinstance(grammar, dict) or grammar.get("syntax") != "lark":
        return None
    definition = grammar.get("definition")
    if not isinstance(definition, str):
        return None
    try:
        compiled = lark_grammar(definition)
    except UnusableGrammar:
        return None

    def check(value: Any, path: str) -> str | None:
        if type(value) is not str:
            return None
        problem = compiled.mismatch(value)
        return None if problem is None else _at(path, problem)

    return check


def _at(path: str, message: str) -> str:
    return f"{path.lstrip('/')}: {message}" if path else message


def _type_check(declared: Any) -> Check:
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list) or not names or any(n not in _TYPES for n in names):
        raise _Unsupported  # BFCL's "dict" / "float": the bounded validator says what is wrong
    tests = [_TYPES[n] for n in names]
    wanted = names[0] if len(names) == 1 else names

    def check(value: Any, path: str) -> str | None:
        if any(test(value) for test in tests):
            return None
        return _at(path, f"{_short(value)} is not of type {wanted!r}")

    return check


def _enum_check(allowed: Any) -> Check:
    # Only enums of strings (all the tools seen): JSON Schema's equality of numbers
    # (1 == 1.0, but not true == 1) is the bounded validator's to apply.
    if not isinstance(allowed, list) or not all(type(a) is str for a in allowed):
        raise _Unsupported
    members = frozenset(allowed)

    def check(value: Any, path: str) -> str | None:
        if type(value) is str and value in members:
            return None
        return _at(path, f"{_short(value)} is not one of {allowed!r}")

    return check


def _size_check(keyword: str, limit: Any, measure: Callable[[Any], int], kind: str) -> Check:
    if type(limit) is not int or limit < 0:
        raise _Unsupported
    applies = _TYPES[kind]
    at_least = keyword.startswith("min")

    def check(value: Any, path: str) -> str | None:
        if not applies(value):
            return None
        size = measure(value)  # len of a str counts code points, as JSON Schema does
        if (size < limit) if at_least else (size > limit):
            which = "short" if kind == "string" else "few items"
            if not at_least:
                which = "long" if kind == "string" else "many items"
            return _at(path, f"{_short(value)} is too {which} ({keyword} {limit})")
        return None

    return check


def _bound_check(keyword: str, bound: Any) -> Check:
    if type(bound) not in (int, float):
        raise _Unsupported
    is_number = _TYPES["number"]
    low = keyword == "minimum"

    def check(value: Any, path: str) -> str | None:
        if not is_number(value):
            return None
        if (value < bound) if low else (value > bound):
            side = "less than the minimum" if low else "greater than the maximum"
            return _at(path, f"{value!r} is {side} of {bound!r}")
        return None

    return check


def _object_check(schema: dict[str, Any], depth: int) -> Check:
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise _Unsupported
    if not all(type(name) is str for name in required) or not isinstance(extra, bool):
        raise _Unsupported  # a schema for extra members: the bounded validator applies it
    checks = {name: _compile(sub, depth + 1) for name, sub in properties.items()}

    def check(value: Any, path: str) -> str | None:
        if type(value) is not dict:
            return None
        for name in required:
            if name not in value:
                return _at(path, f"{name!r} is a required property")
        for name, member in value.items():
            sub = checks.get(name)
            if sub is None:
                if not extra:
                    return _at(
                        path, f"Additional properties are not allowed ({name!r} was unexpected)"
                    )
                continue
            if (problem := sub(member, f"{path}/{name}")) is not None:
                return problem
        return None

    return check


def _items_check(item: Check) -> Check:
    def check(value: Any, path: str) -> str | None:
        if type(value) is not list:
            return None
        for index, member in enumerate(value):
            if (problem := item(member, f"{path}/{index}")) is not None:
                return problem
        return None

    return check


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


__all__ = ["ArgumentsSchema", "TooCostly", "prepare_arguments"]
