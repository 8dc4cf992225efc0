"""The whole API fuzzed against the real app: real Redis, API keys on, the engine's twin.
Every operation of the gateway's own OpenAPI document (gateway/api/openapi.py) is driven
four ways, and a test fails when the app serves a route the document lacks:

1. schemathesis, positive and negative, from the document's own shapes: every answer must
   conform to the document (a documented status, content type and body).
2. hostile values in every path, query and header parameter, one at a time: digits of
   other scripts and digits `int()` refuses (`²`, `①`, `٣`), signs, exponents, hex,
   10**30, 5,000 digits, empty, NUL, percent signs, slashes, 10,000 characters.
3. hostile JSON at every place in a rich request body of each operation, one at a time
   (numbers far out of range, wrong types, other scripts' digits, deep nesting), and JSON
   Schemas that refer to themselves, to nowhere or to elsewhere where a body carries one.
4. engine answers of the wrong shape (`choices` an integer, a tool call without a
   function, usage in words, not JSON at all), whole and streamed, behind every
   operation that asks an engine.

In each: no 500 (a broken engine answer may be 502, 503 or 504), every error in OpenAI's
shape, no exception escaping the app, nothing logged at ERROR. Hostile values reach the
code behind the lookups: each test runs with live ids (a session with a tool result, a
stored response, a held approval, a run-time key) and a policy that turns on what reads
client input: a routable alias (rules, the learned router, the cascade's checks),
approvals, trimming with state tools, volatile-text canonicalization, the answer cache.

Bounded and repeatable: fixed tables, derandomised schemathesis examples, no example
database. Requests go through the app's own TestClient (whose lifespan owns the Redis
connections) rather than schemathesis' ASGI transport, which would start a second
lifespan per call. `FUZZ_EXAMPLES=500` runs more schemathesis examples per operation.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

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
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.api.inference import _ENDPOINTS, _OWN_SHAPES
from gateway.api.openapi import openapi_document
from gateway.app import create_app
from gateway.policy import parse_policy
from gateway.policy.reloadable import load_policy_file
from gateway.state.store import StateStore
from tests.fakes import Call, FakeUpstream, Scripted
from tests.openapi_contract import violations
from tests.policies import with_redis
from tests.unit.tenant_gateway import forget_tenants, sha256

KEY = "sk-agw-fuzz-3c9d2e71b0a4"
ADMIN_KEY = "sk-agw-fuzz-admin-81f0c2d9e5a7"
TENANT = f"fuzz-{uuid.uuid4().hex[:10]}"  # everything the fuzz writes is this tenant's
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))  # per operation and generation mode
POLICY = """\
version: 1
server: {{reload_interval_s: 0}}
auth: {{admin_keys: [{{sha256: {admin_digest}}}]}}
pools:
  small:
    tier: small
    served_model: served-tiny
    serves: [chat, completions, embeddings]
    replicas: [{{url: "http://a.test:1"}}]
  large: {{tier: large, served_model: served-large, replicas: [{{url: "http://b.test:1"}}]}}
models:
  tiny: {{pool: small}}
  routed: {{tiering: auto}}
tiering:
  auto:
    tiers: {{small: small, large: large}}
    rules:
      - {{name: yes-no, when: {{task: [classify], last_user_matches: "^(yes|no)"}}, then: small}}
approvals: {{tools: [cancel_reservation]}}
trimming:
  enabled: true
  state_tools:
    get_reservation_details: {{entity: reservation, id_field: reservation_id}}
canonicalize: {{volatile: {{patterns: [{{name: date}}, {{name: uuid}}]}}}}
health: {{failures_to_unhealthy: 1000000}}  # broken answers (part 4) must neither take the
resilience:  # replica out of the rotation nor open its breaker for the next test
  breaker: {{consecutive_failures: 1000000, min_calls: 1000000}}
  retries: {{attempts: 2, backoff_base_s: 0, backoff_max_s: 0}}
  response_cache: {{enabled: true}}
tenants:
  {tenant}:
    keys: [{{sha256: {key_digest}, name: fuzz, roles: [user, approver]}}]
    limits: {{max_messages: 64}}
"""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# A 502 `invalid_tool_call` is the gateway's documented verdict on the engine's answer (a
# fuzzed tool's schema that the twin's call does not meet), not a fault of its own.
VERDICT_CHECKS = [check for check in CHECKS if check is not not_a_server_error]


def served(response: Any) -> bool:
    """False for a refused tool call, which is still held to the documented shapes."""
    if response.status_code != 502:
        return True
    try:
        return bool(response.json()["error"]["code"] != "invalid_tool_call")
    except (ValueError, KeyError, TypeError):
        return True


# What OpenAI's published schema calls each request the engine serves.
_OPENAI_REQUEST = {
    "/v1/chat/completions": "CreateChatCompletionRequest",
    "/v1/completions": "CreateCompletionRequest",
    "/v1/embeddings": "CreateEmbeddingRequest",
}
HELD_TOOL = "cancel_reservation"  # the policy holds its calls for approval
CANCEL: dict[str, Any] = {"type": "function", "function": {
    "name": HELD_TOOL, "description": "Cancel a reservation.",
    "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}},
                   "required": ["reservation_id"]}}}  # fmt: skip
LOOKUP_CALL = {"id": "c1", "type": "function", "function": {
    "name": "get_reservation_details", "arguments": '{"reservation_id": "R1"}'}}  # fmt: skip
ANSWER = '{"label": "a"}'  # what the engine says: it passes the format BODIES ask for
HISTORY = [  # a tool result (`m2`) of a state tool, so trimming and artifacts have work
    {"role": "system", "content": "You are terse. Today is 2024-05-01."},
    {"role": "user", "content": [{"type": "text", "text": "look up R1"}]},
    {"role": "assistant", "content": None, "tool_calls": [LOOKUP_CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"reservation_id": "R1", "status": "ok"}'},
    {"role": "user", "content": "cancel it"},
]


def _owed(tool_choice: Any, offered: set[Any]) -> str | None:
    """The tool a request's `tool_choice` makes vLLM call (named, or with `required` the
    first offered), None when it may answer in text."""
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        return name if isinstance(name, str) else None
    if tool_choice == "required" and offered:
        return str(sorted(map(str, offered))[0])
    return None


class Engine:
    """vLLM's stand-in: a 400 for what OpenAI's schema refuses, else a well-formed answer
    (streamed when asked; a call of the held tool when offered it, or of the tool
    `tool_choice` names or requires). With `wrong` set, that
    answer instead, whatever was asked."""

    def __init__(self) -> None:
        self.wrong: Scripted | None = None

    def __call__(self, call: Call) -> Scripted:
        if self.wrong is not None:
            return self.wrong
        path = "/" + call.url.split("/", 3)[3]
        body = orjson.loads(call.body)
        if path == "/tokenize":  # vLLM's own: the count of a chat request's prompt
            return Scripted(body=b'{"count": 9, "max_model_len": 2048, "tokens": []}')
        problems = [  # vLLM ignores fields it does not know; OpenAI's schema forbids them
            problem
            for problem in violations(_OPENAI_REQUEST[path], {**body, "model": "gpt-4o"})
            if "Additional properties are not allowed" not in problem
        ]
        if problems:
            error = {"object": "error", "message": problems[0], "type": "BadRequestError",
                     "code": 400}  # fmt: skip
            return Scripted(status=400, body=orjson.dumps(error))
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        if path == "/v1/embeddings":
            data = [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}]
            embedded = {"object": "list", "data": data, "model": "served-tiny", "usage": usage}
            return Scripted(body=orjson.dumps(embedded))
        chat = path == "/v1/chat/completions"
        offered = {
            tool.get("function", {}).get("name")
            for tool in body.get("tools") or ()
            if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
        }
        owed = _owed(body.get("tool_choice"), offered) if chat else None
        held = chat and (HELD_TOOL in offered or owed is not None)
        call_made = {"id": "call_9", "type": "function",
                     "function": {"name": owed or HELD_TOOL, "arguments": '{"reservation_id": "R1"}'}}  # fmt: skip
        if body.get("stream"):
            if held:
                delta: dict[str, Any] = {"delta": {"tool_calls": [{"index": 0, **call_made}]}}
            else:
                delta = {"delta": {"content": ANSWER}} if chat else {"text": "hi"}
            chunk = {"id": "c1", "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": 1, "model": "served-tiny",
                     "choices": [{"index": 0, **delta, "finish_reason": "stop"}]}  # fmt: skip
            events = [b"data: " + orjson.dumps(chunk) + b"\n\n", b"data: [DONE]\n\n"]
            return Scripted(chunks=events, content_type="text/event-stream")
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
        if held:
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": [call_made]}
            choice["finish_reason"] = "tool_calls"
        elif chat:
            choice["message"] = {"role": "assistant", "content": ANSWER, "refusal": None}
        else:
            choice["text"] = "hi"
        answer = {"id": "c1", "object": "chat.completion" if chat else "text_completion",
                  "created": 1, "model": "served-tiny", "choices": [choice], "usage": usage}  # fmt: skip
        return Scripted(body=orjson.dumps(answer))


def fuzzed_document() -> dict[str, Any]:
    """The served document with `model` narrowed to the policy's aliases, so generated
    requests get past the model check into the pipeline."""
    document = openapi_document()
    for schema in document["components"]["schemas"].values():
        model = schema.get("properties", {}).get("model")
        if isinstance(model, dict) and "required" in schema and "model" in schema["required"]:
            model.clear()
            model["enum"] = ["tiny", "routed"]
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


def policy_text(redis_url: str) -> str:
    text = POLICY.format(admin_digest=sha256(ADMIN_KEY), key_digest=sha256(KEY), tenant=TENANT)
    return with_redis(text, redis_url)


class Trouble(logging.Handler):
    """What must never happen: a record logged at ERROR (a bug's traceback), or an
    exception escaping the app (the TestClient would hide one raised mid-stream)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(f"logged: {record.getMessage()} {record.exc_info or ''}")

    def watching(self, app: ASGIApp) -> ASGIApp:
        async def watched(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                await app(scope, receive, send)
            except Exception as exc:
                self.seen.append(f"escaped the app: {exc!r}")
                raise

        return watched

    def take(self) -> list[str]:
        seen, self.seen = self.seen, []
        return seen


@dataclass
class Gateway:
    client: TestClient
    engine: Engine
    trouble: Trouble


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path = tmp_path_factory.mktemp("fuzz") / "policy.yaml"
    path.write_text(policy_text(redis_url))
    policy, source = load_policy_file(path)
    engine = Engine()
    app = create_app(
        policy, upstream=FakeUpstream(engine), store=StateStore(policy.state), policy_file=source
    )
    trouble = Trouble()
    logging.getLogger().addHandler(trouble)
    try:
        with TestClient(trouble.watching(app), raise_server_exceptions=False) as opened:
            yield Gateway(opened, engine, trouble)
    finally:
        logging.getLogger().removeHandler(trouble)
        forget_tenants(redis_url, TENANT)


@pytest.fixture
def client(gateway: Gateway) -> TestClient:
    return gateway.client


def auth(path: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY if path.startswith('/admin/') else KEY}"}


@pytest.fixture
def ids(gateway: Gateway) -> dict[str, str]:
    """Live ids of every kind a path can name, made afresh for each test (a fuzzed DELETE
    or decision may use them up): a session of two turns whose first holds a tool result
    (`m3`) and whose second a held call, a stored response, a run-time key."""
    client = gateway.client
    session = f"fuzz-{uuid.uuid4().hex[:12]}"
    headers = {**auth("/v1"), "X-Session-Id": session}
    first = client.post("/v1/chat/completions", json={"model": "tiny", "messages": HISTORY},
                        headers=headers)  # fmt: skip
    held = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "now"}], "tools": [CANCEL]},
        headers={**headers, "X-Context-Mode": "delta"},
    )
    stored = client.post("/v1/responses", json={"model": "tiny", "input": "hi"}, headers=headers)
    key = client.post(
        "/admin/keys", json={"tenant": TENANT, "name": "seed"}, headers=auth("/admin/")
    )
    for answer in (first, held, stored, key):
        assert answer.status_code in (200, 201), answer.text
    assert not gateway.trouble.take()
    return {
        "session_id": session,
        "turn": "1",
        "handle": "m3",
        "response_id": stored.json()["id"],
        "approval_id": held.headers["X-Gateway-Approval-Pending"],
        "key_id": key.json()["id"],
        "model": "tiny",
        "tenant": TENANT,
    }


def send(client: TestClient, case: Case[Any]) -> Any:
    """The case through the app's own client (httpx), from schemathesis' requests-style
    arguments."""
    kwargs = case.as_transport_kwargs(base_url="http://testserver")
    # The generated Authorization (negative cases make up bad ones) is replaced: every
    # request gets past the key check, which tests/unit/edge/test_auth_keys.py covers.
    headers = {**kwargs["headers"], **auth(case.path)}
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


# Path parameters that name something stored: half the generated cases name a live one,
# so what follows the lookup (a turn's number, an artifact's handle, a body) is reached.
_LIVE = ("session_id", "response_id", "approval_id", "key_id")


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_every_operation_answers_without_5xx_and_as_documented(
    gateway: Gateway, ids: dict[str, str], label: str
) -> None:
    operation = OPERATIONS[label]

    def live(case: Case[Any]) -> Case[Any]:
        for name in _LIVE:
            if name in (case.path_parameters or {}):
                case.path_parameters[name] = ids[name]
        return case

    modes = [operation.as_strategy(generation_mode=mode) for mode in GenerationMode]
    strategy = st.one_of(*modes, *(mode.map(live) for mode in modes))

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
        response = send(gateway.client, case)
        case.validate_response(response, checks=CHECKS if served(response) else VERDICT_CHECKS)
        assert not gateway.trouble.take(), case.as_curl_command()

    run()


# -- 2. hostile parameter values ------------------------------------------------------

HOSTILE_NUMBERS = [
    # digits int() takes from other scripts, digits it refuses though str.isdigit() says
    # yes, and numerals that are neither
    "٣", "३", "１", "𝟙", "²", "①", "⁹", "Ⅻ", "½", "〇",
    # what a parser of numbers might half-accept
    "-1", "0", "+1", " 1", "1 ", "1.5", "1e3", "0x1", "0o7", "1_000", "NaN", "inf", "-inf",
    str(10**30), "9" * 5000,
]  # fmt: skip
HOSTILE_TEXT = [
    *HOSTILE_NUMBERS,
    # what a path, a Redis key or a log line might choke on
    "", "\x00", "%00", "%", "%zz", "a/b", "..", "../../admin/tenants", "\u202e", "😀", "\ufeff1",
    "A" * 10_000, "null", "{}", "'\"\\", "*", "?#",
]  # fmt: skip


def _parameters() -> list[tuple[str, str, str]]:
    """(operation, where, name) of every parameter the document names."""
    found = []
    for label, operation in OPERATIONS.items():
        for parameter in operation.definition.raw.get("parameters", ()):
            found.append((label, parameter["in"], parameter["name"]))
    return sorted(found)


# A rich, valid body for every operation that takes one: each place in it gets hostile
# values in turn (the live ids' placeholders are filled in per test).
BODIES: dict[str, dict[str, Any]] = {
    "POST /v1/chat/completions": {
        "model": "routed", "messages": HISTORY, "tools": [CANCEL], "tool_choice": "auto",
        "stream": False, "max_tokens": 16, "max_completion_tokens": 16, "temperature": 0,
        "top_p": 1, "n": 1, "seed": 7, "user": "u-1", "metadata": {"session_id": "m-1"},
        "response_format": {"type": "json_schema", "json_schema": {"name": "label", "schema": {
            "type": "object", "properties": {"label": {"type": "string", "enum": ["a", "b"]}},
            "required": ["label"]}}},
    },
    "POST /v1/completions": {"model": "routed", "prompt": "Say hi", "stream": False,
                             "max_tokens": 8, "temperature": 0.5},
    "POST /v1/embeddings": {"model": "tiny", "input": ["a", "b"], "encoding_format": "float"},
    "POST /v1/responses": {
        "model": "routed", "input": [{"role": "user", "content": "hi"}], "instructions": "Be brief.",
        "previous_response_id": "{response_id}", "store": True, "stream": False,
        "max_output_tokens": 16, "temperature": 0, "top_p": 1, "metadata": {"k": "v"},
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    },
    "POST /v1/responses/input_tokens": {
        "model": "tiny", "input": [{"role": "user", "content": "hi"}], "instructions": "Be brief.",
        "previous_response_id": "{response_id}",
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}},
                  {"type": "web_search"}],
    },
    "POST /v1/responses/compact": {
        "model": "tiny", "instructions": "Be brief.", "previous_response_id": "{response_id}",
        "input": [{"role": "developer", "content": "Be careful."},
                  {"role": "user", "content": "look up R1"},
                  {"type": "function_call", "call_id": "c1", "name": "lookup",
                   "namespace": "crm", "arguments": '{"id": "R1"}'},
                  {"type": "function_call_output", "call_id": "c1", "output": "R1: booked"}],
    },
    "POST /v1/messages": {
        "model": "routed", "max_tokens": 16, "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look up R1"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
             "name": "get_reservation_details", "input": {"reservation_id": "R1"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
             "content": "R1: booked"}, {"type": "text", "text": "cancel it"}]}],
        "tools": [{"name": HELD_TOOL, "description": "Cancel a reservation.",
                   "input_schema": CANCEL["function"]["parameters"]}],
        "tool_choice": {"type": "auto"}, "stop_sequences": ["END"], "temperature": 0,
        "top_p": 1, "top_k": 5, "metadata": {"user_id": "user_x_account__session_s-1"},
        "thinking": {"type": "disabled"}, "stream": False,
    },
    "POST /v1/messages/count_tokens": {
        "model": "tiny", "system": "Be brief.", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
    },
    "POST /v1/sessions/{session_id}/fork": {"turn": 1, "session_id": "{session_id}.fork"},
    "POST /v1/approvals/{approval_id}": {"decision": "approve", "reason": "fine"},
    "POST /v1/feedback": {"request_id": "req-1", "score": 0.5, "name": "user",
                          "comment": "fine"},
    "POST /admin/keys": {"tenant": TENANT, "name": "k", "roles": ["user", "approver"],
                         "rate_limits": {"requests_per_minute": 5, "tokens_per_minute": 500}},
}  # fmt: skip
STREAMED = {  # the same operations asked for a stream
    "POST /v1/chat/completions": {"model": "tiny", "messages": HISTORY, "tools": [CANCEL],
                                  "stream": True, "stream_options": {"include_usage": True}},
    "POST /v1/completions": {"model": "tiny", "prompt": ["a", "b"], "stream": True},
    "POST /v1/responses": {"model": "tiny", "input": "hi", "stream": True},
    "POST /v1/messages": {"model": "tiny", "max_tokens": 8, "stream": True,
                          "messages": [{"role": "user", "content": "hi"}]},
}  # fmt: skip


def live_body(label: str, ids: dict[str, str], bodies: dict[str, Any] = BODIES) -> Any:
    text = orjson.dumps(bodies[label]).decode()
    for name, value in ids.items():
        text = text.replace("{" + name + "}", value)
    return orjson.loads(text)


@dataclass
class Findings:
    """Every answer that broke a rule, with the request that got it: all of them, not
    just the first, so one run shows the whole of what is wrong."""

    gateway: Gateway
    found: list[str] = field(default_factory=list)

    def send(
        self,
        label: str,
        ids: dict[str, str],
        *,
        path: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
        headers: dict[str, bytes] | None = None,
        body: Any = None,
        engine_broken: bool = False,
    ) -> None:
        method, template = label.split(" ", 1)
        names = re.findall(r"\{(\w+)\}", template)
        values = {name: ids[name] for name in names} | (path or {})
        url = template.format(**{name: quote(values[name], safe="") for name in names})
        sent_headers: dict[str, Any] = {**auth(template), **(headers or {})}
        content = None if body is None else json.dumps(body).encode()
        if content is not None:
            sent_headers["Content-Type"] = "application/json"
        response = self.gateway.client.request(
            method, url, params=query, headers=sent_headers, content=content
        )
        problem = answer_problem(response, engine_broken=engine_broken)
        trouble = self.gateway.trouble.take()
        if problem or trouble:
            shown = {"query": query, "headers": headers, "body": body}
            request = f"{method} {url[:300]} " + repr({k: v for k, v in shown.items() if v})[:600]
            self.found.append(f"{request}\n    -> {problem or ''} {trouble}")

    def assert_none(self) -> None:
        assert not self.found, f"{len(self.found)} bad answers:\n" + "\n".join(self.found[:40])


def answer_problem(response: Any, *, engine_broken: bool) -> str | None:
    """What is wrong with an answer, if anything: an error not in OpenAI's shape, or a
    5xx that is not the engine's doing (a broken engine answer, or an answer that failed
    the checks the client asked for: 502 output_check_failed, or a tool call that breaks
    the tools the client declared, as a hostile schema makes the engine twin's fixed
    call do: 502 invalid_tool_call)."""
    status = response.status_code
    anthropic = response.request.url.path.startswith("/v1/messages")
    try:
        error = response.json()["error"] if status >= 400 else {}
        assert status < 400 or isinstance(error["message"], str)
        if anthropic:  # the Messages API's own shape
            assert status < 400 or response.json()["type"] == "error"
            assert status < 400 or isinstance(error["type"], str)
        else:
            assert status < 400 or {"type", "param", "code"} <= set(error)
    except (ValueError, KeyError, TypeError, AssertionError):
        api = "Anthropic's" if anthropic else "OpenAI's"
        return f"{status}, not in {api} error shape: {response.text[:300]}"
    engines = (502, 503, 504) if engine_broken else ()
    engine_failed_the_client = error.get("code") in ("output_check_failed", "invalid_tool_call")
    if anthropic:  # Anthropic's shape has no code: the refusal says what it is
        engine_failed_the_client = error.get("message", "").startswith(
            ("The model's tool call was refused", "The answer of tier")
        )
    if status >= 500 and status not in engines and not engine_failed_the_client:
        return f"{status} {response.text[:300]}"
    return None


@pytest.mark.parametrize(("label", "where", "name"), _parameters())
def test_hostile_parameter_values_are_refused_without_5xx(
    gateway: Gateway, ids: dict[str, str], label: str, where: str, name: str
) -> None:
    findings = Findings(gateway)
    body = live_body(label, ids) if label in BODIES else None
    # Alone, and after the live value's first character: a handle is `m` and a number.
    start = ids.get(name, "x")[:1]
    for value in HOSTILE_TEXT + [start + number for number in HOSTILE_NUMBERS]:
        if where == "path":
            findings.send(label, ids, path={name: value}, body=body)
        elif where == "query":
            findings.send(label, ids, query={name: value}, body=body)
        else:
            findings.send(label, ids, headers={name: value.encode()}, body=body)
    findings.assert_none()


# -- 3. hostile JSON in bodies ----------------------------------------------------------

HOSTILE_JSON: list[Any] = [
    10**30, -(10**30), -1, 0, 1.5, 1e308, True, None, "", "²", "٣", "9" * 5000,
    [], {}, [None], {"$ref": "#"}, "x" * 100_000,
]  # fmt: skip
# Where a body carries a JSON Schema (a tool's parameters, a response format), also these.
HOSTILE_SCHEMAS: list[Any] = [
    {"$ref": "#"},
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"allOf": [{"$ref": "#"}]},
    {"$ref": "#/$defs/missing"},
    {"$ref": "http://127.0.0.1:9/schema.json"},
    {"$ref": "file:///etc/passwd"},
    {"type": "string", "pattern": "("},
    {"type": "string", "pattern": "(a+)+$"},
    {"type": "nonsense"},
    {"type": "object", "properties": 5},
    {"enum": []},
    {"minimum": "x"},
    {"$schema": "http://json-schema.org/draft-03/schema#", "type": "any"},
    True,
    False,
    {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(500)}},
]
_SCHEMA_PLACES = ("schema", "parameters")


def places(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path to every value inside a JSON document, containers included."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*at, key)
            yield from places(inner, (*at, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield (*at, index)
            yield from places(inner, (*at, index))


def replaced(document: Any, at: tuple[Any, ...], value: Any) -> Any:
    changed = copy.deepcopy(document)
    holder = changed
    for step in at[:-1]:
        holder = holder[step]
    holder[at[-1]] = value
    return changed


def _bodies() -> list[tuple[str, bool]]:
    return sorted([(label, False) for label in BODIES] + [(label, True) for label in STREAMED])


@pytest.mark.parametrize(("label", "streamed"), _bodies())
def test_hostile_json_anywhere_in_a_body_is_refused_without_5xx(
    gateway: Gateway, ids: dict[str, str], label: str, streamed: bool
) -> None:
    findings = Findings(gateway)
    body = live_body(label, ids, STREAMED if streamed else BODIES)
    findings.send(label, ids, body=body)  # the control: the body as it is
    for at in places(body):
        values = HOSTILE_JSON + (HOSTILE_SCHEMAS if at[-1] in _SCHEMA_PLACES else [])
        for value in values:
            findings.send(label, ids, body=replaced(body, at, value))
    findings.assert_none()


def test_every_body_operation_has_a_rich_body_to_fuzz() -> None:
    with_body = {label for label, op in OPERATIONS.items() if op.definition.raw.get("requestBody")}
    assert with_body == set(BODIES)


# -- 4. engine answers of the wrong shape -----------------------------------------------


def _whole(value: Any) -> Scripted:
    return Scripted(body=value if isinstance(value, bytes) else json.dumps(value).encode())


def _stream(*events: bytes, **options: Any) -> Scripted:
    return Scripted(chunks=list(events), content_type="text/event-stream", **options)


_CALL = {"id": "call_1", "type": "function",
         "function": {"name": HELD_TOOL, "arguments": '{"reservation_id": "R1"}'}}  # fmt: skip
_OK_CHOICE = {
    "index": 0,
    "finish_reason": "stop",
    "message": {"role": "assistant", "content": "{}"},
}
WRONG_ANSWERS: dict[str, Scripted] = {
    "empty": _whole(b""),
    "not JSON": _whole(b"<html>busy</html>"),
    "cut short": _whole(b'{"choices": [{"message": {"content": "h'),
    "a list": _whole([]),
    "null": _whole(None),
    "a string": _whole("text"),
    "choices an integer": _whole({"choices": 5}),
    "choices of integers": _whole({"choices": [5]}),
    "choices empty": _whole({"choices": []}),
    "message an integer": _whole({"choices": [{"message": 5}]}),
    "content an integer": _whole({"choices": [{"message": {"content": 5}}]}),
    "tool_calls a string": _whole({"choices": [{"message": {"tool_calls": "x"}}]}),
    "tool_calls of integers": _whole({"choices": [{"message": {"tool_calls": [5]}}]}),
    "function an integer": _whole({"choices": [{"message": {"tool_calls": [{"function": 5}]}}]}),
    "arguments an integer": _whole({"choices": [{"message": {"tool_calls": [
        {**_CALL, "function": {"name": HELD_TOOL, "arguments": 5}}]}}]}),
    "name an integer, arguments cut": _whole({"choices": [{"message": {"tool_calls": [
        {"id": 5, "function": {"name": 5, "arguments": "{"}}]}}]}),
    "text an integer": _whole({"choices": [{"text": 5, "index": "x"}]}),
    "usage in words": _whole({"choices": [_OK_CHOICE], "usage": "lots"}),
    "usage numbers wrong": _whole({"choices": [_OK_CHOICE], "usage": {
        "prompt_tokens": "x", "completion_tokens": -1, "total_tokens": 10**30,
        "prompt_tokens_details": 5}}),
    "usage counts null": _whole({"choices": [_OK_CHOICE], "usage": {
        "prompt_tokens": None, "completion_tokens": 1.5, "prompt_tokens_details": {"cached_tokens": "x"}}}),
    "fields of the wrong type": _whole({"id": 5, "object": 5, "model": 5, "created": "x",
        "choices": [{"index": "x", "finish_reason": 5, "message": {"role": 5, "content": "{}"}}]}),
    "data an integer": _whole({"data": 5}),
    "embedding a string": _whole({"data": [{"embedding": "x", "index": "0"}], "usage": 5}),
    "an error object with 200": _whole({"error": "x"}),
    "nested too deep": _whole(b'{"choices": ' + b"[" * 2000 + b"]" * 2000 + b"}"),
    "a number too big": _whole(b'{"created": 1e999, "choices": []}'),
    "status 500 with a broken body": Scripted(status=500, body=b"{"),
    "status 200 as text/html": Scripted(body=b"<h1>hi</h1>", content_type="text/html"),
    "a stream where a whole answer was asked": _stream(b"data: {}\n\n", b"data: [DONE]\n\n"),
}  # fmt: skip
_DONE = b"data: [DONE]\n\n"
WRONG_STREAMS: dict[str, Scripted] = {
    "no events": _stream(),
    "not JSON": _stream(b"data: not json\n\n", _DONE),
    "an integer": _stream(b"data: 5\n\n", _DONE),
    "choices an integer": _stream(b'data: {"choices": 5}\n\n', _DONE),
    "delta an integer": _stream(b'data: {"choices": [{"delta": 5}]}\n\n', _DONE),
    "content and tool_calls wrong": _stream(
        b'data: {"choices": [{"delta": {"content": 5, "tool_calls": 5}}]}\n\n', _DONE),
    "tool call index a string": _stream(
        b'data: {"choices": [{"delta": {"tool_calls": [{"index": "x", "function": {"arguments": 5}}]}}]}\n\n', _DONE),
    "held call cut, no DONE": _stream(
        b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "cancel_reservation", "arguments": "{"}}]}}]}\n\n'),
    "usage in words": _stream(b'data: {"choices": [], "usage": {"prompt_tokens": "x"}}\n\n', _DONE),
    "text an integer": _stream(b'data: {"choices": [{"text": 5}]}\n\n', _DONE),
    "bytes not UTF-8": _stream(b"data: \xff\xfe\x00\n\n", _DONE),
    "no data prefix": _stream(b"{}\n\n", b"event: error\ndata: {}\n\n", _DONE),
    "broken mid-stream": _stream(
        b'data: {"choices": [{"index": 0, "delta": {"content": "h"}}]}\n\n', _DONE, break_after=1),
    "a whole answer where a stream was asked": _whole({"choices": [_OK_CHOICE]}),
}  # fmt: skip
ENGINE_CALLS: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "chat": ("POST /v1/chat/completions", {"model": "tiny", "messages": HISTORY}, {}),
    "chat in a session, tools offered": ("POST /v1/chat/completions",
        {"model": "tiny", "messages": HISTORY, "tools": [CANCEL]}, {"X-Session-Id": "{session_id}"}),
    "chat with a checked format, routed": ("POST /v1/chat/completions",
        BODIES["POST /v1/chat/completions"], {}),
    "completions": ("POST /v1/completions", {"model": "routed", "prompt": "hi"}, {}),
    "embeddings": ("POST /v1/embeddings", {"model": "tiny", "input": "hi"}, {}),
    "responses": ("POST /v1/responses", {"model": "tiny", "input": "hi"}, {}),
    "messages": ("POST /v1/messages", {"model": "tiny", "max_tokens": 8,
                 "messages": [{"role": "user", "content": "hi"}]}, {}),
    "input_tokens": ("POST /v1/responses/input_tokens", {"model": "tiny", "input": "hi"}, {}),
    "count_tokens": ("POST /v1/messages/count_tokens", {"model": "tiny",
                     "messages": [{"role": "user", "content": "hi"}]}, {}),
}  # fmt: skip


def _engine_calls() -> list[tuple[str, bool]]:
    return sorted([(name, streamed) for name in ENGINE_CALLS for streamed in (False, True)
                   if not (streamed and name in ("embeddings", "count_tokens", "input_tokens"))])  # fmt: skip


@pytest.mark.parametrize(("call", "streamed"), _engine_calls())
def test_engine_answers_of_the_wrong_shape_never_500(
    gateway: Gateway, ids: dict[str, str], call: str, streamed: bool
) -> None:
    label, body, headers = ENGINE_CALLS[call]
    body = {**body, "stream": True} if streamed else body
    sent_headers = {name: value.format(**ids).encode() for name, value in headers.items()}
    findings = Findings(gateway)
    try:
        for name, wrong in (WRONG_STREAMS if streamed else WRONG_ANSWERS).items():
            gateway.engine.wrong = wrong
            before = len(findings.found)
            findings.send(label, ids, headers=sent_headers, body=body, engine_broken=True)
            if len(findings.found) > before:
                findings.found[-1] = f"[engine: {name}] " + findings.found[-1]
    finally:
        gateway.engine.wrong = None
    findings.assert_none()


# -- the document covers the app ----------------------------------------------------------


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


def test_the_document_names_every_route_the_app_serves(redis_url: str) -> None:
    """A route added without describing it here fails this test, so the fuzz runs keep
    covering the whole API."""
    app = create_app(parse_policy(policy_text(redis_url)))
    served = {(path, "POST") for path in (*_ENDPOINTS, *_OWN_SHAPES)}
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


def test_the_live_ids_are_live(client: TestClient, ids: dict[str, str]) -> None:
    """The control for the fuzz: what the live ids name exists, so hostile values in the
    other parameters reach what follows the lookup."""
    session = ids["session_id"]
    for path in (
        f"/v1/sessions/{session}/checkpoints/1",
        f"/v1/sessions/{session}/artifacts/{ids['handle']}",
        f"/v1/responses/{ids['response_id']}",
        f"/v1/approvals/{ids['approval_id']}",
    ):
        assert client.get(path, headers=auth(path)).status_code == 200, path
    listed = client.get("/admin/keys", params={"tenant": TENANT}, headers=auth("/admin/")).json()
    assert ids["key_id"] in {key["id"] for key in listed["data"]}


def test_the_document_is_served_and_valid(client: TestClient) -> None:
    response = client.get("/openapi.json", headers=auth("/"))
    assert response.status_code == 200
    assert response.json() == openapi_document()
    schemathesis.openapi.from_dict(response.json()).validate()
