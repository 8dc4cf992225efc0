"""The keywords of JSON Schema 2020-12 the gateway's validator applies: where each one's
subschemas sit, and the shape its value must have for the validator to run it.

`jsonschema` assumes a schema is valid: `{"type": 5}`, `{"required": [{}]}` or
`{"multipleOf": 0}` make it raise in the middle of a check. Its own meta-schema check costs
about 185 us per value of the schema (the 2020-12 meta-schema crosses seven documents by a
dynamic reference at every subschema: 45 ms for a 465-value schema), too much to run on
every request. The shapes below are the meta-schema's own rules for exactly these
keywords, checked in the walk that finds the subschemas anyway;
tests/unit/untrusted/test_keywords.py proves they refuse what the meta-schema refuses.
Keywords the validator does not apply (annotations, unknown ones) are the engine's to judge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

# Where subschemas sit: applied to the same value ("in place"), to a nested value, or not
# applied at all (`$defs`: only reached by reference). As `referencing` lists them.
IN_PLACE_ONE = ("not", "if", "then", "else")
IN_PLACE_ARRAYS = ("allOf", "anyOf", "oneOf")
IN_PLACE_MAPS = ("dependentSchemas",)
NESTED_ONE = (
    "additionalProperties",
    "propertyNames",
    "items",
    "contains",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
NESTED_ARRAYS = ("prefixItems",)
NESTED_MAPS = ("properties", "patternProperties", "$defs", "definitions")
REFERENCES = ("$ref", "$dynamicRef")

_SIMPLE_TYPES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})


def _schema(value: Any) -> bool:
    return isinstance(value, dict | bool)


def _schema_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(map(_schema, value))


def _schema_map(value: Any) -> bool:
    return isinstance(value, dict) and all(map(_schema, value.values()))


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


def _count(value: Any) -> bool:
    """A non-negative integer; JSON Schema's `integer` includes 2.0."""
    return _number(value) and value >= 0 and (isinstance(value, int) or value.is_integer())


def _boolean(value: Any) -> bool:
    return isinstance(value, bool)


def _array(value: Any) -> bool:
    return isinstance(value, list)


def _names(value: Any) -> bool:
    return (
        isinstance(value, list)
        and all(isinstance(item, str) for item in value)
        and len(set(value)) == len(value)
    )


def _names_map(value: Any) -> bool:
    return isinstance(value, dict) and all(map(_names, value.values()))


def _types(value: Any) -> bool:
    if isinstance(value, str):
        return value in _SIMPLE_TYPES
    return bool(_names(value) and value) and all(item in _SIMPLE_TYPES for item in value)


_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{k: (_schema, "a schema (an object or a boolean)") for k in (*IN_PLACE_ONE, *NESTED_ONE)},
    **{k: (_schema_array, "a non-empty array of schemas") for k in IN_PLACE_ARRAYS},
    **{k: (_schema_array, "a non-empty array of schemas") for k in NESTED_ARRAYS},
    **{k: (_schema_map, "an object whose values are schemas") for k in IN_PLACE_MAPS},
    **{k: (_schema_map, "an object whose values are schemas") for k in NESTED_MAPS},
    **{k: (_string, "a string") for k in (*REFERENCES, "$id", "$anchor", "$dynamicAnchor")},
    "format": (_string, "a string"),
    "pattern": (_string, "a string"),
    "type": (_types, f"one of {sorted(_SIMPLE_TYPES)}, or a non-empty array of them"),
    "enum": (_array, "an array"),
    "multipleOf": (_positive, "a number above 0"),
    **{
        k: (_number, "a number")
        for k in ("maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum")
    },
    **{
        k: (_count, "a non-negative integer")
        for k in (
            "maxLength",
            "minLength",
            "maxItems",
            "minItems",
            "maxContains",
            "minContains",
            "maxProperties",
            "minProperties",
        )
    },
    "uniqueItems": (_boolean, "a boolean"),
    "required": (_names, "an array of distinct strings"),
    "dependentRequired": (_names_map, "an object whose values are arrays of distinct strings"),
}


def misshapen(schema: dict[str, Any]) -> tuple[str, str] | None:
    """(keyword, what its value must be) for the first keyword the validator cannot run."""
    for keyword, value in schema.items():
        rule = _RULES.get(keyword)
        if rule is not None and not rule[0](value):
            if keyword == "items" and isinstance(value, list):
                return keyword, "a schema (for a tuple, use `prefixItems`)"
            return keyword, rule[1]
    return None


# keyword -> (how its subschemas are held: one, array or map; applied in place?)
_PLACES: dict[str, tuple[str, bool]] = {
    **{k: ("one", True) for k in IN_PLACE_ONE},
    **{k: ("array", True) for k in IN_PLACE_ARRAYS},
    **{k: ("map", True) for k in IN_PLACE_MAPS},
    **{k: ("one", False) for k in NESTED_ONE},
    **{k: ("array", False) for k in NESTED_ARRAYS},
    **{k: ("map", False) for k in NESTED_MAPS},
}


def subschemas_in(schema: dict[str, Any], where: str) -> Iterator[tuple[Any, str]]:
    """Each subschema of a (well-shaped) schema, with its JSON pointer."""
    for keyword, value in schema.items():
        place = _PLACES.get(keyword)
        if place is None:
            continue
        held = place[0]
        if held == "one":
            yield value, f"{where}/{keyword}"
        elif held == "array":
            for index, item in enumerate(value):
                yield item, f"{where}/{keyword}/{index}"
        else:
            for name, item in value.items():
                yield item, f"{where}/{keyword}/{escape(name)}"


def in_place_subschemas(schema: dict[str, Any]) -> Iterator[Any]:
    """The subschemas applied to the same value as `schema` itself (references aside)."""
    for keyword, value in schema.items():
        place = _PLACES.get(keyword)
        if place is None or not place[1]:
            continue
        held = place[0]
        if held == "one":
            yield value
        elif held == "array":
            yield from value
        else:
            yield from value.values()


def escape(name: str) -> str:
    """A JSON pointer segment."""
    if "~" in name or "/" in name:
        return name.replace("~", "~0").replace("/", "~1")
    return name
