"""JSON Schemas a client (a `response_format`) or a policy (guardrails, entity schemas)
wrote: prepared once, then applied with a bounded validator.

Preparing a schema refuses, with the reason and the place (a JSON pointer):

- a document of more than `MAX_SCHEMA_NODES` values or nested past `MAX_SCHEMA_DEPTH`;
- a keyword the validator applies whose value it cannot run (`{"type": 5}`); every schema
  is checked as JSON Schema 2020-12: a root `$schema` naming another dialect is ignored;
- `$id` or `$schema` below the root: an embedded resource could move the base that
  references resolve against (and `$schema` would switch `jsonschema` to one of its own
  validator classes, which run Python's `re`);
- any reference that does not start with `#`: a URL, a file, a URN, a relative path.
  Nothing is ever fetched (the validator's registry refuses retrieval too);
- a reference that does not resolve, or points at something that is not a subschema;
- references that loop without reaching a nested value (`{"$ref": "#"}`, `$defs` a -> b
  -> a through `allOf`): checking one value would recurse forever. Recursion through
  `properties`, `items`, ... (a tree) is fine: it ends with the value's own nesting;
- more than `MAX_IN_PLACE_DEPTH` subschemas chained on one value, or more than
  `MAX_IN_PLACE_SUBSCHEMAS` applied to one value (`allOf` of `allOf`s doubling);
- a pattern RE2 cannot run, or more than `MAX_PATTERN_CHARS` of patterns;
- `unevaluatedProperties` beside `patternProperties` (the library checks that pair with
  Python's backtracking `re`).

Applying it (`first_error`) spends at most `CHECK_STEPS` keyword evaluations and checks
values nested at most `MAX_VALUE_DEPTH` deep: past either it raises `TooCostly`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import referencing.exceptions
import referencing.jsonschema
from jsonschema.protocols import Validator

from gateway.untrusted.json_depth import deeper_by_walk
from gateway.untrusted.keywords import (
    REFERENCES,
    escape,
    in_place_subschemas,
    misshapen,
    subschemas_in,
)
from gateway.untrusted.regex import LinearRegex, UnsafePattern
from gateway.untrusted.validator import (
    BoundedValidator,
    Run,
    TooCostly,
    document_registry,
    running,
)

__all__ = ["ClientSchema", "TooCostly", "UnsafeSchema", "prepare"]

# Constants, not policy: far above the schemas structured outputs use (OpenAI's own limits:
# 5,000 properties, 10 levels of objects) and low enough that preparing the largest schema
# allowed costs ~25 ms of the event loop (10,000 values, measured on 2 cores).
MAX_SCHEMA_NODES = 10_000  # every JSON value of the document, data (enum, ...) included
MAX_SCHEMA_DEPTH = 64  # arrays and objects, the document itself level 1
MAX_PATTERN_CHARS = 16_384  # all patterns together: RE2 compiles about 3 KB a millisecond
MAX_IN_PLACE_DEPTH = 32  # subschemas chained on one value ($ref -> allOf -> $ref ...)
MAX_IN_PLACE_SUBSCHEMAS = 1_000  # subschemas one value can be checked against
# Keyword evaluations in one check. `jsonschema` takes ~12 us for one (measured on 2
# cores), so a check holds the event loop ~0.12 s at most; an answer of 700 objects of
# five string fields takes ~9,800.
CHECK_STEPS = 10_000
# Nesting of a checked value. `jsonschema` recurses about 4 frames a level (a tree schema
# runs out of the 1,000-frame stack at 250 levels, measured), and more where subschemas
# chain on one value: 48 leaves room for those, and the app's own frames.
MAX_VALUE_DEPTH = 48


class UnsafeSchema(ValueError):
    """A schema the gateway will not apply. `reason` says what and where; `code` is
    `invalid_schema` (malformed) or `unsupported_schema` (well-formed, but refused)."""

    def __init__(self, reason: str, *, code: str = "unsupported_schema") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True, eq=False)
class ClientSchema:
    """A prepared schema. Equal to another with the same document (a policy reloaded
    unchanged compares equal)."""

    document: dict[str, Any] | bool
    _validator: Validator = field(repr=False)
    _patterns: Mapping[str, LinearRegex] = field(repr=False)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientSchema) and other.document == self.document

    def first_error(self, value: Any) -> str | None:
        """What is wrong with `value` (`<path>: <message>`), or None when it conforms.
        `TooCostly` when it nests too deep or checking it goes past the budget."""
        if type(value) in (dict, list) and deeper_by_walk(value, 1, MAX_VALUE_DEPTH):
            raise TooCostly(f"the value nests deeper than {MAX_VALUE_DEPTH} levels")
        with running(Run(CHECK_STEPS, self._patterns)):
            errors = self._validator.iter_errors(value)
            try:
                error = next(errors, None)
            except RecursionError:
                raise TooCostly("checking it nested deeper than the stack allows") from None
            except TooCostly:
                raise TooCostly(
                    f"checking it took more than {CHECK_STEPS:,} keyword evaluations"
                ) from None
            finally:
                errors.close()  # type: ignore[attr-defined]
        if error is None:
            return None
        where = "/".join(str(part) for part in error.absolute_path)
        return f"{where + ': ' if where else ''}{error.message}"


def prepare(schema: Any) -> ClientSchema:
    """`schema` (parsed JSON: an object or a boolean) made ready to check values against;
    `UnsafeSchema` when it is refused. The caller's object is not changed."""
    if isinstance(schema, bool):
        return ClientSchema(schema, BoundedValidator(schema, registry=document_registry()), {})
    if not isinstance(schema, dict):
        raise UnsafeSchema("a schema must be a JSON object or a boolean", code="invalid_schema")
    _check_size(schema)
    document = {key: value for key, value in schema.items() if key != "$schema"}
    subschemas = _subschemas(document)
    patterns = _compiled_patterns(subschemas)
    _check_in_place(_in_place_edges(document, subschemas), subschemas)
    validator = BoundedValidator(document, registry=document_registry())
    return ClientSchema(document, validator, patterns)


def _check_size(schema: dict[str, Any]) -> None:
    """Counted level by level, without recursion; a structure that contains itself (YAML
    aliases can build one) grows past both bounds and is refused."""
    nodes = 1
    level: list[Any] = [schema]
    depth = 1
    while level:
        if depth > MAX_SCHEMA_DEPTH:
            raise UnsafeSchema(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        nested: list[Any] = []
        for value in level:
            for child in value.values() if isinstance(value, dict) else value:
                nodes += 1
                if isinstance(child, dict | list):
                    nested.append(child)
            if nodes > MAX_SCHEMA_NODES:
                raise UnsafeSchema(f"the schema has more than {MAX_SCHEMA_NODES:,} values")
        level = nested
        depth += 1


@dataclass
class _Subschema:
    schema: dict[str, Any]
    where: str  # JSON pointer from the document's root


def _subschemas(document: dict[str, Any]) -> dict[int, _Subschema]:
    """Every object in a subschema position, by identity (references resolve to these
    very objects), with its place; each checked for the shape of its keywords."""
    found: dict[int, _Subschema] = {}
    pending: list[tuple[Any, str]] = [(document, "")]
    while pending:
        schema, where = pending.pop()
        if not isinstance(schema, dict) or id(schema) in found:
            continue
        if (wrong := misshapen(schema)) is not None:
            keyword, expected = wrong
            raise UnsafeSchema(
                f"not a valid JSON Schema: `{keyword}` at {_shown(where)} must be {expected}",
                code="invalid_schema",
            )
        if schema is not document:
            for keyword in ("$id", "$schema"):
                if keyword in schema:
                    raise UnsafeSchema(
                        f"`{keyword}` at {_shown(where)}: only the root of the schema may "
                        "have one (an embedded resource could move where references point)"
                    )
        found[id(schema)] = _Subschema(schema, where)
        pending.extend(subschemas_in(schema, where))
    return found


def _compiled_patterns(subschemas: dict[int, _Subschema]) -> dict[str, LinearRegex]:
    compiled: dict[str, LinearRegex] = {}
    total = 0
    uses_unevaluated = uses_pattern_properties = False
    for sub in subschemas.values():
        schema = sub.schema
        uses_unevaluated |= "unevaluatedProperties" in schema
        uses_pattern_properties |= "patternProperties" in schema
        found = [(schema["pattern"], f"{sub.where}/pattern")] if "pattern" in schema else []
        found += [
            (name, f"{sub.where}/patternProperties/{escape(name)}")
            for name in schema.get("patternProperties", {})
        ]
        for pattern, where in found:
            if pattern in compiled:
                continue
            total += len(pattern)
            if total > MAX_PATTERN_CHARS:
                raise UnsafeSchema(
                    f"the schema's patterns are longer than {MAX_PATTERN_CHARS:,} characters"
                )
            try:
                compiled[pattern] = LinearRegex(pattern)
            except UnsafePattern as exc:
                raise UnsafeSchema(
                    f"pattern {pattern!r} at {where} cannot be checked in linear time: "
                    f"{exc.reason} (RE2 syntax: no backreferences, no lookaround)"
                ) from None
    if uses_unevaluated and uses_pattern_properties:
        raise UnsafeSchema(
            "`unevaluatedProperties` together with `patternProperties` is not supported"
        )
    return compiled


def _in_place_edges(
    document: dict[str, Any], subschemas: dict[int, _Subschema]
) -> dict[int, list[int]]:
    """For each subschema, the subschemas applied to the same value: what its references
    point at, and its in-place applicators. References must stay inside the document."""
    resource = referencing.jsonschema.DRAFT202012.create_resource(document)
    resolver = document_registry().resolver_with_root(resource)
    edges: dict[int, list[int]] = {}
    for key, sub in subschemas.items():
        targets = [
            _target(resolver.lookup, sub.schema[keyword], f"{sub.where}/{keyword}", subschemas)
            for keyword in REFERENCES
            if keyword in sub.schema
        ]
        targets += in_place_subschemas(sub.schema)
        edges[key] = [id(target) for target in targets if isinstance(target, dict)]
    return edges


def _target(
    lookup: Callable[[str], Any],
    reference: str,
    where: str,
    subschemas: dict[int, _Subschema],
) -> Any:
    keyword = where.rsplit("/", 1)[1]
    if not reference.startswith("#"):
        raise UnsafeSchema(
            f"`{keyword}` {reference!r} at {where} points outside the schema: only references "
            "inside it (`#/$defs/...`, `#name`) are resolved, nothing is fetched"
        )
    try:
        target = lookup(reference).contents
    except referencing.exceptions.Unresolvable:
        raise UnsafeSchema(
            f"`{keyword}` {reference!r} at {where} does not resolve inside the schema"
        ) from None
    if not isinstance(target, bool) and id(target) not in subschemas:
        raise UnsafeSchema(
            f"`{keyword}` {reference!r} at {where} does not point at a subschema "
            "(put shared definitions under `$defs`)"
        )
    return target


def _check_in_place(edges: dict[int, list[int]], subschemas: dict[int, _Subschema]) -> None:
    """No loop of subschemas applied to the same value; bounded chains and fan-out.
    Depth first without recursion, each subschema's figures computed once on the way back."""
    chain: dict[int, int] = {}  # the longest chain of in-place subschemas from here
    applied: dict[int, int] = {}  # how many subschemas a value checked here meets
    for start in edges:
        if start in chain:
            continue
        on_path = {start}
        stack: list[tuple[int, Iterator[int]]] = [(start, iter(edges[start]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.discard(node)
                _measure(node, edges[node], chain, applied, subschemas)
            elif child in on_path:
                raise UnsafeSchema(
                    f"the subschema at {_shown(subschemas[child].where)} is applied again "
                    f"(from {_shown(subschemas[node].where)}) to the same value: checking "
                    "it would never end; recursion must go through a nested value "
                    "(`properties`, `items`, ...)"
                )
            elif child not in chain:
                on_path.add(child)
                stack.append((child, iter(edges[child])))


def _measure(
    node: int,
    children: list[int],
    chain: dict[int, int],
    applied: dict[int, int],
    subschemas: dict[int, _Subschema],
) -> None:
    if not children:  # most subschemas: a leaf of the in-place graph
        chain[node] = applied[node] = 1
        return
    chain[node] = 1 + max(chain[c] for c in children)
    # Capped: a doubling `allOf` ladder would otherwise make numbers of thousands of digits.
    applied[node] = min(1 + sum(applied[c] for c in children), MAX_IN_PLACE_SUBSCHEMAS + 1)
    if chain[node] > MAX_IN_PLACE_DEPTH:
        raise UnsafeSchema(
            f"at {_shown(subschemas[node].where)}, more than {MAX_IN_PLACE_DEPTH} subschemas "
            "are chained on one value"
        )
    if applied[node] > MAX_IN_PLACE_SUBSCHEMAS:
        raise UnsafeSchema(
            f"at {_shown(subschemas[node].where)}, one value would be checked against more "
            f"than {MAX_IN_PLACE_SUBSCHEMAS:,} subschemas"
        )


def _shown(where: str) -> str:
    return where or "the root"
