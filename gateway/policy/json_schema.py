"""The policy's JSON Schema as `policies/policy.schema.json` holds it (editors' completion;
`gateway policy schema`, `make schema`; a test fails when the file drifts)."""

from __future__ import annotations

import json

from gateway.policy.schema import Policy


def policy_json_schema() -> str:
    schema = Policy.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "agent-gateway policy"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
