"""The JSON Schema validator untrusted schemas are applied with, and what bounds it.

`jsonschema`'s 2020-12 validator, extended so that:

- no keyword runs Python's `re`: `pattern`, `patternProperties` and `additionalProperties`
  (which consults `patternProperties`) match with RE2 (gateway/untrusted/regex.py);
- `uniqueItems` costs time linear in the array (the library compares every pair of
  unsortable items: 2,000 distinct objects took 7 s, measured);
- every keyword evaluation spends one step of the budget of the run in progress, so no
  schema and no value can keep it going: past the budget it raises `TooCostly`;
- references never leave the document: the validator's registry retrieves nothing.

A run's budget and its compiled patterns travel in a context variable, set by `running()` for
exactly the duration of one check: `jsonschema` builds a new validator object at every
subschema and carries over only its own fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import referencing
import referencing.exceptions
from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.protocols import Validator

from gateway.untrusted.regex import LinearRegex


class TooCostly(Exception):
    """A check went past its step budget, or nested past what Python's stack holds."""


def refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    """The registry's `retrieve`: a reference outside the document resolves to nothing.
    (`jsonschema`'s default registry fetches it over HTTP or from a file.)"""
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


def document_registry() -> referencing.Registry[Any]:
    return referencing.Registry(retrieve=refuse_retrieval)  # type: ignore[call-arg]


@dataclass
class Run:
    """One check in progress: the steps it has left and the schema's patterns, compiled."""

    steps_left: int
    patterns: Mapping[str, LinearRegex] = field(default_factory=dict)

    def spend(self, steps: int = 1) -> None:
        self.steps_left -= steps
        if self.steps_left < 0:
            raise TooCostly("the check went past its step budget")

    def regex(self, pattern: str) -> LinearRegex:
        compiled = self.patterns.get(pattern)
        # Every pattern of a prepared schema is compiled already; the meta-schema's own are
        # compiled here (RE2 keeps them cached).
        return compiled if compiled is not None else LinearRegex(pattern)


_RUN: ContextVar[Run] = ContextVar("untrusted_schema_run")


@contextmanager
def running(run: Run) -> Iterator[Run]:
    token = _RUN.set(run)
    try:
        yield run
    finally:
        _RUN.reset(token)


Keyword = Callable[[Any, Any, Any, Any], Any]


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _RUN.get().regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    run = _RUN.get()
    for pattern, subschema in patterns.items():
        regex = run.regex(pattern)
        for key, value in instance.items():
            if regex.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    run = _RUN.get()
    patterns = [run.regex(p) for p in schema.get("patternProperties", {})]
    extras = [
        key
        for key in instance
        if key not in properties and not any(regex.search(key) for regex in patterns)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        listed = ", ".join(repr(extra) for extra in sorted(extras))
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            regexes = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            yield ValidationError(f"{listed} {verb} not match any of the regexes: {regexes}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({listed} {verb} unexpected)"
            )


def _unique_items(
    validator: Any, unique: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    _RUN.get().spend(len(instance))  # linear work, one step an item
    seen: set[Any] = set()
    for item in instance:
        key = _equality_key(item)
        if key in seen:
            yield ValidationError(f"{instance!r} has non-unique elements")
            return
        seen.add(key)


def _equality_key(value: Any) -> Any:
    """Hashable, and equal for two values exactly when JSON Schema calls them equal: 1 and
    1.0 are, `true` and 1 are not, object members are unordered."""
    if value is True or value is False:
        return ("boolean", value)
    if isinstance(value, int | float):
        return ("number", value)  # 1 == 1.0 and hash(1) == hash(1.0)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(_equality_key(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((key, _equality_key(item)) for key, item in value.items()))
    return ("null",)


def _counted(keyword: Keyword) -> Keyword:
    # Not a generator itself: `jsonschema` calls each keyword and iterates what it returns
    # at once, so the step is spent at the call, without a frame per keyword.
    def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _RUN.get().spend()
        return keyword(validator, value, instance, schema)

    return counted


_RE2_KEYWORDS: dict[str, Keyword] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}

BoundedValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {
        name: _counted(keyword)
        for name, keyword in {**Draft202012Validator.VALIDATORS, **_RE2_KEYWORDS}.items()
    },
)
