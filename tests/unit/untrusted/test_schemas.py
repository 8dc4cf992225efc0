"""Preparing a client's or a policy's JSON Schema: what is refused (references outside the
document, loops, sizes, patterns), with the place named; and applying it: correct on
legitimate schemas (trees included), bounded in steps and in depth, never fetching."""

from __future__ import annotations

from typing import Any

import pytest
import referencing.exceptions
from jsonschema import Draft202012Validator

from gateway.untrusted import schemas
from gateway.untrusted.schemas import ClientSchema, TooCostly, UnsafeSchema, prepare
from gateway.untrusted.validator import BoundedValidator, Run, document_registry, running
from tests.unit.deadline import deadline


def refused(schema: Any) -> UnsafeSchema:
    with pytest.raises(UnsafeSchema) as caught:
        prepare(schema)
    return caught.value


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"$ref": "http://127.0.0.1:9/creds"}, "'http://127.0.0.1:9/creds' at /$ref"),
        ({"$ref": "https://example.test/s.json#/a"}, "'https://example.test/s.json#/a' at /$ref"),
        ({"$ref": "file:///etc/passwd"}, "'file:///etc/passwd' at /$ref"),
        ({"$ref": "urn:example:x"}, "'urn:example:x' at /$ref"),
        ({"$ref": "other.json"}, "'other.json' at /$ref"),
        ({"$ref": "//evil.test/x"}, "'//evil.test/x' at /$ref"),
        ({"$dynamicRef": "http://x.test/m#meta"}, "'http://x.test/m#meta' at /$dynamicRef"),
        (
            {"$id": "http://evil.test/base/", "items": {"$ref": "creds"}},
            "'creds' at /items/$ref",
        ),
        (
            {"properties": {"a~b/c": {"$ref": "http://x.test/"}}},
            "at /properties/a~0b~1c/$ref",
        ),
    ],
)
def test_a_reference_outside_the_document_is_refused(schema: dict[str, Any], named: str) -> None:
    problem = refused(schema)
    assert named in problem.reason
    assert "points outside the schema" in problem.reason
    assert problem.code == "unsupported_schema"


@pytest.mark.parametrize("keyword", ["$id", "$schema"])
def test_an_embedded_resource_is_refused(keyword: str) -> None:
    problem = refused({"properties": {"a": {keyword: "http://x.test/", "$ref": "#/b"}}})
    assert f"`{keyword}` at /properties/a" in problem.reason


def test_a_property_named_like_a_keyword_is_data() -> None:
    prepared = prepare(
        {
            "type": "object",
            "properties": {"$ref": {"type": "string"}, "$id": {"const": "http://x.test/"}},
            "enum": [{"$ref": "http://x.test/"}],
            "default": {"$ref": "file:///etc/passwd"},
        }
    )
    assert prepared.first_error({"$ref": "http://x.test/"}) is None


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"$ref": "#/$defs/missing"}, "does not resolve inside the schema"),
        ({"$ref": "#nowhere"}, "does not resolve inside the schema"),
        ({"required": ["a"], "$ref": "#/required"}, "does not point at a subschema"),
        (
            {"x-defs": {"a": {"type": "string"}}, "$ref": "#/x-defs/a"},
            "does not point at a subschema",
        ),
        ({"enum": [{"type": 5}], "$ref": "#/enum/0"}, "does not point at a subschema"),
    ],
)
def test_a_reference_must_reach_a_subschema_of_the_document(
    schema: dict[str, Any], why: str
) -> None:
    assert why in refused(schema).reason


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"allOf": [{"$ref": "#"}]},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {
            "$defs": {
                "a": {"allOf": [{"$ref": "#/$defs/b"}]},
                "b": {"oneOf": [{"$ref": "#/$defs/a"}]},
            }
        },
        {"$defs": {"a": {"$anchor": "loop", "not": {"$ref": "#loop"}}}},
        {"$defs": {"a": {"$dynamicAnchor": "m", "if": {"$dynamicRef": "#m"}}}},
        {"dependentSchemas": {"x": {"$ref": "#"}}},
    ],
)
def test_a_loop_that_never_reaches_a_nested_value_is_refused(schema: dict[str, Any]) -> None:
    problem = refused(schema)
    assert "never end" in problem.reason
    assert problem.code == "unsupported_schema"


TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["value"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}


def test_recursion_through_nested_values_checks_as_before() -> None:
    prepared = prepare(TREE)
    official = Draft202012Validator(TREE)
    values: list[Any] = [
        {"value": 1},
        {"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]},
        {"value": 1, "children": [{"value": 2, "children": [{"value": "3"}]}]},
        {"value": 1, "children": [{"value": 2, "extra": True}]},
        {"children": []},
        [],
    ]
    for value in values:
        error = prepared.first_error(value)
        assert (error is None) == official.is_valid(value)
    nested_error = prepared.first_error(values[2])
    assert nested_error == "children/0/children/0/value: '3' is not of type 'integer'"


def test_a_root_schema_naming_another_dialect_is_checked_as_2020_12() -> None:
    prepared = prepare({"$schema": "http://json-schema.org/draft-07/schema#", "pattern": "^a"})
    assert prepared.first_error("ab") is None
    assert prepared.first_error("ba") == "'ba' does not match '^a'"
    assert prepared.document == {"pattern": "^a"}  # never reaching jsonschema's own classes


def test_the_caller_s_schema_is_not_changed() -> None:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "string"}
    prepare(schema)
    assert "$schema" in schema


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": 5}, "`type` at the root"),
        ({"type": "strnig"}, "`type` at the root"),
        ({"properties": []}, "`properties` at the root"),
        ({"properties": {"a": {"minimum": "1"}}}, "`minimum` at /properties/a"),
        ({"required": [{}]}, "`required` at the root"),
        ({"multipleOf": 0}, "`multipleOf` at the root"),
        ({"items": [{"type": "string"}]}, "for a tuple, use `prefixItems`"),
        ({"$ref": 5}, "`$ref` at the root"),
        ({"$anchor": {}}, "`$anchor` at the root"),
        ({"enum": "ab"}, "`enum` at the root"),
        ({"allOf": []}, "`allOf` at the root"),
    ],
)
def test_a_keyword_the_validator_cannot_run_is_an_invalid_schema(
    schema: dict[str, Any], named: str
) -> None:
    problem = refused(schema)
    assert named in problem.reason
    assert problem.code == "invalid_schema"


def test_a_schema_is_an_object_or_a_boolean() -> None:
    assert refused([{"type": "string"}]).code == "invalid_schema"
    assert prepare(True).first_error(1) is None
    assert prepare(False).first_error(1) == "False schema does not allow 1"


def test_the_size_and_depth_of_the_document_are_bounded() -> None:
    many = {"enum": list(range(schemas.MAX_SCHEMA_NODES))}
    assert "more than 10,000 values" in refused(many).reason
    prepare({"enum": list(range(schemas.MAX_SCHEMA_NODES - 2))})
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(schemas.MAX_SCHEMA_DEPTH):
        deep = {"items": deep}
    assert "nests deeper than 64 levels" in refused(deep).reason


def test_a_document_that_contains_itself_is_refused() -> None:
    looped: dict[str, Any] = {"type": "object"}
    looped["properties"] = {"self": looped}  # what YAML aliases can build
    assert "nests deeper" in refused(looped).reason


def test_chains_and_fan_out_on_one_value_are_bounded() -> None:
    chain: dict[str, Any] = {"$defs": {}}
    for i in range(schemas.MAX_IN_PLACE_DEPTH + 1):
        chain["$defs"][f"d{i}"] = {"$ref": f"#/$defs/d{i + 1}"}
    chain["$defs"][f"d{schemas.MAX_IN_PLACE_DEPTH + 1}"] = {"type": "string"}
    assert "more than 32 subschemas are chained" in refused(chain).reason
    # Each level applies the next one twice: 2^12 subschemas for one value, in 40 values.
    ladder: dict[str, Any] = {"$defs": {"l12": {"type": "string"}}}
    for i in range(12):
        ladder["$defs"][f"l{i}"] = {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}] * 2}
    assert "against more than 1,000 subschemas" in refused(ladder).reason


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"pattern": "(a)\\1"}, "'(a)\\\\1' at /pattern"),
        ({"properties": {"a": {"pattern": "(?=x)"}}}, "'(?=x)' at /properties/a/pattern"),
        ({"patternProperties": {"(?<!a)b": {}}}, "'(?<!a)b' at /patternProperties/(?<!a)b"),
    ],
)
def test_a_pattern_re2_cannot_run_is_refused_naming_it(schema: dict[str, Any], named: str) -> None:
    problem = refused(schema)
    assert named in problem.reason
    assert "cannot be checked in linear time" in problem.reason


def test_patterns_are_bounded_in_length() -> None:
    long = {"anyOf": [{"pattern": f"^{i:05d}" + "x" * 1_000} for i in range(17)]}
    assert "longer than 16,384 characters" in refused(long).reason


def test_unevaluated_properties_beside_pattern_properties_is_refused() -> None:
    both = {"patternProperties": {"^a": {}}, "unevaluatedProperties": False}
    assert "`unevaluatedProperties` together with `patternProperties`" in refused(both).reason


def test_patterns_run_with_re2_in_every_keyword_that_uses_one() -> None:
    backtracking = "^(a+)+b$"
    prepared = prepare(
        {
            "type": "object",
            "properties": {"s": {"type": "string", "pattern": backtracking}},
            "patternProperties": {backtracking: {"type": "integer"}},
            "additionalProperties": False,
        }
    )
    evil = "a" * 10_000 + "c"
    with deadline():  # Python's `re` would never finish
        errors = [
            prepared.first_error({"s": evil}),
            prepared.first_error({evil: 1}),
            prepared.first_error({"a" * 30 + "b": "not an integer"}),
        ]
    assert errors[0] is not None and "does not match" in errors[0]
    assert errors[1] is not None and "does not match any of the regexes" in errors[1]
    assert errors[2] is not None and "is not of type 'integer'" in errors[2]


def test_checking_is_bounded_in_steps() -> None:
    row = {"type": "object", "properties": {f"f{i}": {"type": "string"} for i in range(5)}}
    prepared = prepare({"type": "array", "items": row})
    assert prepared.first_error([{"f0": "a"}] * 100) is None
    with pytest.raises(TooCostly, match="more than 10,000 keyword evaluations"):
        prepared.first_error([{f"f{i}": "a" for i in range(5)}] * 2_000)


def test_a_value_nested_too_deep_is_too_costly_not_a_crash() -> None:
    prepared = prepare(TREE)
    deep: dict[str, Any] = {"value": 1}
    for _ in range(schemas.MAX_VALUE_DEPTH):
        deep = {"value": 1, "children": [deep]}
    with pytest.raises(TooCostly, match="nests deeper than 48 levels"):
        prepared.first_error(deep)
    chain: dict[str, Any] = {"$defs": {}, "$ref": "#/$defs/d0"}
    for i in range(15):  # 15 x (allOf, $ref): 31 subschemas chained, within the bound
        chain["$defs"][f"d{i}"] = {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}]}
    chain["$defs"]["d15"] = {"type": "object", "properties": {"c": {"$ref": "#/$defs/d0"}}}
    nested: dict[str, Any] = {}
    for _ in range(40):
        nested = {"c": nested}
    with pytest.raises(TooCostly, match="deeper than the stack allows"):
        prepare(chain).first_error(nested)


def test_unique_items_is_linear_and_keeps_json_equality() -> None:
    unique = prepare({"uniqueItems": True})
    assert unique.first_error([{}] * 2) is not None
    assert unique.first_error([{"a": [1, 2]}, {"a": [1.0, 2.0]}]) is not None  # 1 == 1.0
    assert unique.first_error([{"a": 1, "b": 2}, {"b": 2, "a": 1}]) is not None
    assert unique.first_error([1, True]) is None  # true is not 1
    assert unique.first_error([0, False, None, "0", [0], {"0": 0}]) is None
    assert unique.first_error([[1, 2], [2, 1]]) is None
    distinct = [{"i": i} for i in range(5_000)]
    assert unique.first_error(distinct) is None  # the library compared every pair
    with pytest.raises(TooCostly):
        unique.first_error([{"i": i} for i in range(20_000)])


def test_prepared_schemas_compare_by_their_document() -> None:
    assert prepare({"type": "string"}) == prepare({"type": "string"})
    assert prepare({"type": "string"}) != prepare({"type": "integer"})
    assert isinstance(prepare({}), ClientSchema)


def test_the_validator_s_registry_never_retrieves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond the refusal at preparation: a validator built on a schema that was never
    prepared still resolves nothing outside it (no URL opened, no file read)."""
    import urllib.request

    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the validator tried to fetch a reference")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    validator = BoundedValidator({"$ref": "http://127.0.0.1:9/x"}, registry=document_registry())
    with running(Run(100)), pytest.raises(referencing.exceptions.Unresolvable):
        validator.validate("anything")
