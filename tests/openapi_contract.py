"""Validators for OpenAI's published OpenAPI schemas (../shared/data/openai/openapi.yaml).

The spec is OpenAPI 3.1 (JSON Schema 2020-12) but still carries 3.0's `nullable: true` in
places; that is turned into "or null" before validating.
"""

from __future__ import annotations

import functools
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.conftest import SHARED_DATA

SPEC = SHARED_DATA / "openai" / "openapi.yaml"
_URI = "urn:openai-openapi"


def _nullable(node: Any) -> Any:
    if isinstance(node, dict):
        converted = {k: _nullable(v) for k, v in node.items() if k != "nullable"}
        if node.get("nullable") is True:
            return {"anyOf": [converted, {"type": "null"}]}
        return converted
    if isinstance(node, list):
        return [_nullable(v) for v in node]
    return node


@functools.cache
def _registry() -> Registry[Any]:
    spec = _nullable(yaml.load(SPEC.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader))
    resource: Resource[Any] = Resource.from_contents(spec, default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource(_URI, resource)
    return registry


@functools.cache
def validator(schema_name: str) -> Draft202012Validator:
    return Draft202012Validator(
        {"$ref": f"{_URI}#/components/schemas/{schema_name}"}, registry=_registry()
    )


def violations(schema_name: str, instance: Any) -> list[str]:
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator(schema_name).iter_errors(instance)
    ]
