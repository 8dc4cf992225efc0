"""policies/policy.schema.json is generated from the models; it must not drift."""

from __future__ import annotations

import json

import jsonschema
import yaml

from gateway.policy.json_schema import policy_json_schema
from tests.conftest import ROOT


def test_committed_schema_matches_the_models() -> None:
    committed = (ROOT / "policies" / "policy.schema.json").read_text()
    assert committed == policy_json_schema(), "run `make schema` and commit the result"


def test_default_policy_validates_against_the_schema() -> None:
    schema = json.loads(policy_json_schema())
    data = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    # ${VAR:-default} strings stand where integers go until the loader expands them.
    data["server"] = {"host": "127.0.0.1", "port": 8080}
    jsonschema.validate(data, schema)
