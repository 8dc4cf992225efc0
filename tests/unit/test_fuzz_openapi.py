"""The gateway's own OpenAPI document (gateway/api/openapi.py), fuzzed with schemathesis
against the real app: real Redis, API keys on, the engine's twin answering like vLLM
(refusing what OpenAI's published schema refuses). No operation may answer 5xx, and
every answer must conform to the document: a documented status, a documented content
type, a body matching the schema.

Bounded and repeatable: a fixed number of examples per operation, derandomised, no
example database, so every run sends the same requests and takes a few seconds. Requests
are sent through the app's own TestClient (whose lifespan owns the Redis connections)
rather than schemathesis' ASGI transport, which would start a second lifespan per call.

The admin API is fuzzed too, with an admin key (and a policy file, so a reload has
something to check): keys are made for a tenant of the test's own, deleted afterwards.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.testclient import TestClient

from gateway.api.calls import _ENDPOINTS, _RESPONSES
from gateway.api.openapi import openapi_document
from gateway.app import create_app
from gateway.policy import parse_policy
from gateway.policy.reloadable import load_policy_file
from gateway.state_store import StateStore
from tests.fakes import Call, FakeUpstream, Scripted
from tests.openapi_contract import violations
from tests.unit.tenant_gateway import forget_tenants, sha256

KEY = "sk-agw-fuzz-3c9d2e71b0a4"
ADMIN_KEY = "sk-agw-fuzz-admin-81f0c2d9e5a7"
TENANT = f"fuzz-{uuid.uuid4().hex[:10]}"  # the keys the admin API makes are this tenant's
EXAMPLES = 25  # per operation and generation mode: ~20 operations, a few seconds in all
POLICY = """\
version: 1
state: {{redis_url: "{redis_url}"}}
server: {{reload_interval_s: 0}}
auth: {{keys_file: "{keys}", admin_keys: [{{sha256: {admin_digest}}}]}}
pools:
  chat:
    served_model: served-tiny
    serves: [chat, completions, embeddings]
    replicas: [{{url: "http://a.test:1"}}]
models:
  tiny: {{pool: chat}}
tenants:
  {tenant}:
    limits: {{max_messages: 64}}
    trimming: {{enabled: true}}
"""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

# What OpenAI's published schema calls each request the engine serves.
_OPENAI_REQUEST = {
    "/v1/chat/completions": "CreateChatCompletionRequest",
    "/v1/completions": "CreateCompletionRequest",
    "/v1/embeddings": "CreateEmbeddingRequest",
}


def engine(call: Call) -> Scripted:
    """vLLM's stand-in: a 400 for what OpenAI's schema refuses, else a well-formed answer
    (streamed when asked)."""
    path = call.url.split("/", 3)[3]
    path = "/" + path
    body = orjson.loads(call.body)
    problems = [  # vLLM ignores fields it does not know; OpenAI's schema forbids them
        problem
        for problem in violations(_OPENAI_REQUEST[path], {**body, "model": "gpt-4o"})
        if "Additional properties are not allowed" not in problem
    ]
    if problems:
        error = {"object": "error", "message": problems[0], "type": "BadRequestError", "code": 400}
        return Scripted(status=400, body=orjson.dumps(error))
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    if path == "/v1/embeddings":
        data = [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}]
        embedded = {"object": "list", "data": data, "model": "served-tiny", "usage": usage}
        return Scripted(body=orjson.dumps(embedded))
    chat = path == "/v1/chat/completions"
    if body.get("stream"):
        delta = {"delta": {"content": "hi"}} if chat else {"text": "hi"}
        chunk = {"id": "c1", "object": "chat.completion.chunk" if chat else "text_completion",
                 "created": 1, "model": "served-tiny",
                 "choices": [{"index": 0, **delta, "finish_reason": "stop"}]}  # fmt: skip
        events = [b"data: " + orjson.dumps(chunk) + b"\n\n", b"data: [DONE]\n\n"]
        return Scripted(chunks=events, content_type="text/event-stream")
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": "hi", "refusal": None}
    else:
        choice["text"] = "hi"
    answer = {"id": "c1", "object": "chat.completion" if chat else "text_completion",
              "created": 1, "model": "served-tiny", "choices": [choice], "usage": usage}  # fmt: skip
    return Scripted(body=orjson.dumps(answer))


def fuzzed_document() -> dict[str, Any]:
    """The served document with `model` narrowed to the policy's alias, so generated
    requests get past the model check into the pipeline."""
    document = openapi_document()
    for schema in document["components"]["schemas"].values():
        model = schema.get("properties", {}).get("model")
        if isinstance(model, dict) and "required" in schema and "model" in schema["required"]:
            model.clear()
            model["enum"] = ["tiny"]
    # The admin API's tenant: the test's own, so generated requests reach the key store.
    document["components"]["schemas"]["ApiKeyRequest"]["properties"]["tenant"] = {"enum": [TENANT]}
    for path, operations in document["paths"].items():
        for operation in operations.values() if path.startswith("/admin/") else ():
            for parameter in operation.get("parameters", ()):
                if parameter["name"] == "tenant":
                    parameter["schema"] = {"enum": [TENANT]}
    return document


SCHEMA = schemathesis.openapi.from_dict(fuzzed_document())


def _operations() -> dict[str, APIOperation[Any, Any, Any, Any]]:
    found = {}
    for result in SCHEMA.get_all_operations():
        if isinstance(result, Err):  # the document does not parse: fail at collection
            raise result.err()
        found[result.ok().label] = result.ok()
    return found


OPERATIONS = _operations()


def policy_text(redis_url: str, keys: Path) -> str:
    keys.write_text(f"{KEY}\n")
    return POLICY.format(
        redis_url=redis_url, keys=keys, admin_digest=sha256(ADMIN_KEY), tenant=TENANT
    )


@pytest.fixture(scope="module")
def client(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    where = tmp_path_factory.mktemp("fuzz")
    path = where / "policy.yaml"
    path.write_text(policy_text(redis_url, where / "keys"))
    policy, source = load_policy_file(path)
    app = create_app(
        policy, upstream=FakeUpstream(engine), store=StateStore(policy.state), policy_file=source
    )
    try:
        with TestClient(app, raise_server_exceptions=False) as opened:
            yield opened
    finally:
        forget_tenants(redis_url, TENANT)  # the keys the admin API was asked to make


def send(client: TestClient, case: Case[Any]) -> Any:
    """The case through the app's own client (httpx), from schemathesis' requests-style
    arguments."""
    kwargs = case.as_transport_kwargs(base_url="http://testserver")
    # The generated Authorization (negative cases make up bad ones) is replaced: every
    # request gets past the key check, which tests/unit/test_auth_keys.py covers.
    key = ADMIN_KEY if case.path.startswith("/admin/") else KEY
    headers = {**kwargs["headers"], "Authorization": f"Bearer {key}"}
    content = kwargs.get("data")
    if "json" in kwargs:  # stdlib json: generated integers may exceed 64 bits
        content = json.dumps(kwargs["json"]).encode()
    return client.request(
        kwargs["method"],
        kwargs["url"],
        headers=headers,
        params=kwargs.get("params") or None,
        content=content,
    )


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_every_operation_answers_without_5xx_and_as_documented(
    client: TestClient, label: str
) -> None:
    operation = OPERATIONS[label]
    strategy = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Case[Any]) -> None:
        response = send(client, case)
        case.validate_response(response, checks=CHECKS)

    run()


def _routes(routes: list[Any]) -> Iterator[Any]:
    """Every route, through the routers FastAPI includes lazily (`original_router`; the
    gateway includes them without a prefix)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _routes(included.routes)
        else:
            yield route


def _template(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def test_the_document_names_every_route_the_app_serves(redis_url: str, tmp_path: Path) -> None:
    """A route added without describing it here fails this test, so the fuzz run keeps
    covering the whole API."""
    app = create_app(parse_policy(policy_text(redis_url, tmp_path / "keys")))
    served = {(path, "POST") for path in (*_ENDPOINTS, _RESPONSES)}
    for route in _routes(app.routes):
        methods = getattr(route, "methods", None) or ()
        served |= {(_template(getattr(route, "path", "")), m) for m in methods if m != "HEAD"}
    document = openapi_document()
    described = {
        (_template(path), method.upper())
        for path, operations in document["paths"].items()
        for method in operations
    }
    assert served == described


def test_the_document_is_served_and_valid(client: TestClient) -> None:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    assert response.json() == openapi_document()
    schemathesis.openapi.from_dict(response.json()).validate()
