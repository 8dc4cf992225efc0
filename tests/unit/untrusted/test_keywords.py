"""The shapes the gateway checks before applying a schema are the 2020-12 meta-schema's
own, for every keyword the validator runs: what one refuses, `jsonschema`'s official
meta-schema check refuses too, and both accept what real schemas hold."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gateway.untrusted.keywords import misshapen

META = Draft202012Validator(Draft202012Validator.META_SCHEMA)  # no format checks: as ours
SCHEMA_KEYWORDS = [
    "not", "if", "then", "else", "additionalProperties", "propertyNames", "items",
    "contains", "unevaluatedItems", "unevaluatedProperties", "contentSchema",
]  # fmt: skip
SCHEMA_ARRAYS = ["allOf", "anyOf", "oneOf", "prefixItems"]
SCHEMA_MAPS = ["dependentSchemas", "properties", "patternProperties", "$defs", "definitions"]
COUNTS = [
    "maxLength", "minLength", "maxItems", "minItems", "maxContains", "minContains",
    "maxProperties", "minProperties",
]  # fmt: skip
NUMBERS = ["maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"]
STRINGS = ["$ref", "$dynamicRef", "$id", "format", "pattern"]


def each(keywords: list[str], values: tuple[Any, ...]) -> list[tuple[str, Any]]:
    return [(keyword, value) for keyword in keywords for value in values]


MALFORMED: list[tuple[str, Any]] = [
    *each(SCHEMA_KEYWORDS, (1, "x", [], None)),
    *each(SCHEMA_ARRAYS, ([], {}, [1], ["x"], True)),
    *each(SCHEMA_MAPS, ([], {"a": 1}, {"a": "x"}, "x")),
    *each(COUNTS, (-1, 1.5, "1", True, None, [])),
    *each(NUMBERS, ("1", True, None, [])),
    *each(STRINGS, (1, [], {}, None, True)),
    *each(["$anchor"], (1, {}, None)),
    *each(["$dynamicAnchor"], (1, {}, None)),
    *each(["type"], (5, "strnig", [], ["string", "string"], [5], None)),
    *each(["enum"], ("ab", {}, 1, None)),
    *each(["multipleOf"], (0, -1, "2", True)),
    *each(["uniqueItems"], (1, "true", None)),
    *each(["required"], ("a", [1], ["a", "a"], [{}], {})),
    *each(["dependentRequired"], ([], {"a": "b"}, {"a": [1]}, {"a": ["b", "b"]})),
]
WELL_FORMED: list[tuple[str, Any]] = [
    *each(SCHEMA_KEYWORDS, ({}, True, False, {"type": "string"})),
    *each(SCHEMA_ARRAYS, ([{}], [True, {"type": "null"}])),
    *each(SCHEMA_MAPS, ({}, {"a": {}, "b": False})),
    *each(COUNTS, (0, 3, 2.0)),
    *each(NUMBERS, (0, -1.5, 10**20)),
    ("$ref", "#/$defs/a"),
    ("$dynamicRef", "#meta"),
    ("$id", "https://example.test/s"),
    ("$anchor", "name"),
    ("$dynamicAnchor", "meta"),
    ("format", "date-time"),
    ("pattern", "^a+$"),
    *each(["type"], ("string", ["string", "null"], "integer")),
    *each(["enum"], ([], [1, "a", None, {"x": [1]}])),
    *each(["multipleOf"], (1, 0.01)),
    ("uniqueItems", False),
    *each(["required"], ([], ["a", "b"])),
    ("dependentRequired", {"a": ["b"], "c": []}),
    ("title", 5),  # not a keyword the validator runs: the engine's to judge
]


def official_accepts(schema: dict[str, Any]) -> bool:
    return META.is_valid(schema)


@pytest.mark.parametrize(("keyword", "value"), MALFORMED)
def test_what_the_gateway_refuses_the_meta_schema_refuses(keyword: str, value: Any) -> None:
    schema = {keyword: value}
    assert misshapen(schema) is not None
    assert not official_accepts(schema)
    assert misshapen({"properties": {"a": schema}}) is None  # only this level is looked at


@pytest.mark.parametrize(("keyword", "value"), WELL_FORMED)
def test_what_the_meta_schema_accepts_the_gateway_accepts(keyword: str, value: Any) -> None:
    schema = {keyword: value}
    assert misshapen(schema) is None
    assert official_accepts(schema) or keyword == "title"
