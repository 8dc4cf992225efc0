"""Client JSON Schemas through the real app (engine twin, real Redis): a schema is data,
never a fetcher. A reference outside the schema (a URL, a file, a URN, a `$id` rebasing a
relative one) is a 400 naming the field before any engine is asked, on Chat Completions
(routed or not) and on the Responses API, and nothing is fetched; a reference loop is a
400, not a 500; a tree schema still checks answers; a pattern runs in linear time while
/healthz stays fast; an answer too costly to check is a clear 400."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from gateway.policy import Policy
from tests.fakes import Call, Scripted
from tests.policies import parse_with_redis
from tests.unit.clients import OpenGateways

POLICY = """\
version: 1
pools:
  small-pool: {tier: small, served_model: s, replicas: [{url: "http://small.test:1"}]}
  large-pool: {tier: large, served_model: l, replicas: [{url: "http://large.test:1"}]}
models:
  small: {pool: small-pool}
  auto: {tiering: default}
tiering:
  default:
    tiers: {small: small-pool, large: large-pool}
    learned: null
"""
SECRET = "SECRET-the-gateway-must-never-read"
CHAT_PARAM = "response_format.json_schema.schema"


class Engines:
    """Answers per host; remembers what each was asked."""

    def __init__(self, answers: dict[str, str | bytes]) -> None:
        self.answers = answers
        self.hosts: list[str] = []

    def __call__(self, call: Call) -> Scripted:
        host = call.url.split("//")[1].split(".")[0]
        self.hosts.append(host)
        answer = self.answers[host]
        text = answer.decode() if isinstance(answer, bytes) else answer
        message = {"role": "assistant", "content": text}
        completion = {
            "id": "c", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
        }  # fmt: skip
        return Scripted(body=orjson.dumps(completion))


class Listener(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that records every connection made to it (a TLS
    handshake too) and would serve a schema holding the secret."""

    def __init__(self) -> None:
        self.connections: list[tuple[str, int]] = []
        super().__init__(("127.0.0.1", 0), _Secret)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.connections.append(client_address)
        return True


class _Secret(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = orjson.dumps({"enum": [SECRET]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "creds.json"
    path.write_bytes(orjson.dumps({"enum": [SECRET]}))
    return path


@pytest.fixture
def policy(redis_url: str) -> Policy:
    return parse_with_redis(POLICY, redis_url)


def chat(model: str, schema: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "answer"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }


def outside_references(listener: Listener, secret_file: Path) -> list[dict[str, Any]]:
    base = f"http://127.0.0.1:{listener.server_address[1]}"
    return [
        {"$ref": f"{base}/creds"},
        {"type": "object", "properties": {"a": {"$ref": f"{base}/creds"}}},
        {"$defs": {"x": {"$ref": f"{base}/creds"}}, "$ref": "#/$defs/x"},
        {"$dynamicRef": f"{base}/creds"},
        {"$ref": f"https://127.0.0.1:{listener.server_address[1]}/creds"},
        {"$ref": secret_file.as_uri()},
        {"$ref": "urn:example:creds"},
        {"$id": f"{base}/schemas/", "$ref": "creds"},  # relative, rebased onto the server
        {"properties": {"a": {"$id": f"{base}/", "$ref": "#/nothing"}}},
    ]


@pytest.mark.parametrize("model", ["small", "auto"])
def test_a_reference_outside_the_schema_is_a_400_and_nothing_is_fetched(
    policy: Policy,
    gateways: OpenGateways,
    listener: Listener,
    secret_file: Path,
    model: str,
) -> None:
    engines = Engines({"small": '{"a": 1}', "large": '{"a": 1}'})
    client, _ = gateways.open(policy, engines)
    for schema in outside_references(listener, secret_file):
        response = client.post("/v1/chat/completions", json=chat(model, schema))
        assert response.status_code == 400, schema
        error = response.json()["error"]
        assert error["param"] == CHAT_PARAM
        assert error["code"] == "unsupported_schema"
        assert error["type"] == "invalid_request_error"
        assert SECRET not in response.text
    assert listener.connections == []
    assert engines.hosts == []  # refused before any engine was asked


def test_the_responses_api_names_its_own_field(
    policy: Policy, gateways: OpenGateways, listener: Listener, secret_file: Path
) -> None:
    engines = Engines({"small": '{"a": 1}', "large": '{"a": 1}'})
    client, _ = gateways.open(policy, engines)
    for schema in outside_references(listener, secret_file):
        text = {"format": {"type": "json_schema", "name": "x", "schema": schema}}
        response = client.post("/v1/responses", json={"model": "auto", "input": "hi", "text": text})
        assert response.status_code == 400, schema
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("text.format.schema", "unsupported_schema")
        assert SECRET not in response.text
    assert listener.connections == []
    assert engines.hosts == []


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {
            "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"anyOf": [{"$ref": "#"}]}},
            "$ref": "#/$defs/a",
        },
        {"type": "object", "properties": {"a": {"not": {"$ref": "#/properties/a"}}}},
    ],
)
@pytest.mark.parametrize("model", ["small", "auto"])
def test_a_reference_loop_is_a_400_not_a_500(
    policy: Policy, gateways: OpenGateways, schema: dict[str, Any], model: str
) -> None:
    engines = Engines({"small": "{}", "large": "{}"})
    client, _ = gateways.open(policy, engines)
    response = client.post("/v1/chat/completions", json=chat(model, schema))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (CHAT_PARAM, "unsupported_schema")
    assert "never end" in error["message"]
    assert engines.hosts == []


TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["name"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}


def test_a_tree_schema_recursing_through_properties_still_checks_answers(
    policy: Policy, gateways: OpenGateways
) -> None:
    good = '{"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}'
    bad = '{"name": "a", "children": [{"name": "b", "children": [{"name": 3}]}]}'
    engines = Engines({"small": bad, "large": good})
    client, _ = gateways.open(policy, engines)
    response = client.post("/v1/chat/completions", json=chat("auto", TREE))
    assert response.status_code == 200
    assert response.headers["x-gateway-tier"] == "large"
    assert response.headers["x-gateway-route-reason"] == (
        "cascade: small failed response_format, escalated to large"
    )
    assert engines.hosts == ["small", "large"]
    engines.answers["small"] = good
    response = client.post("/v1/chat/completions", json=chat("auto", TREE))
    assert (response.status_code, response.headers["x-gateway-tier"]) == (200, "small")


def test_a_schema_past_the_size_bound_is_a_400(policy: Policy, gateways: OpenGateways) -> None:
    engines = Engines({"small": "{}", "large": "{}"})
    client, _ = gateways.open(policy, engines)
    huge = {"type": "string", "enum": [f"v{i}" for i in range(10_001)]}
    response = client.post("/v1/chat/completions", json=chat("small", huge))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (CHAT_PARAM, "unsupported_schema")
    assert "more than 10,000 values" in error["message"]
    assert engines.hosts == []


def test_a_pattern_re2_cannot_run_is_a_400(policy: Policy, gateways: OpenGateways) -> None:
    engines = Engines({"small": "{}", "large": "{}"})
    client, _ = gateways.open(policy, engines)
    lookbehind = {"type": "string", "pattern": "(?<!a)b"}
    response = client.post("/v1/chat/completions", json=chat("small", lookbehind))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (CHAT_PARAM, "unsupported_schema")
    assert "'(?<!a)b' at /pattern" in error["message"]


BACKTRACKING = {"type": "string", "pattern": "^(a+)+b$|^a*$"}


async def asgi(app: Any, method: str, path: str, body: bytes = b"") -> int:
    """One request straight into the app, in the app's own event loop: the time it takes
    is the time the loop took to serve it, with no client thread in between."""
    status = 0
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    headers = [(b"host", b"testserver"), (b"content-type", b"application/json")]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80), "state": {}, "app": app,
    }  # fmt: skip
    await app(scope, receive, send)
    return status


def test_a_backtracking_pattern_runs_in_linear_time_and_healthz_stays_fast(
    policy: Policy, gateways: OpenGateways
) -> None:
    """Python's `re` took 7.5 s on 28 `a`s, and /healthz 1.9 s meanwhile: the check held
    the event loop. /healthz is timed inside that loop while the answers are checked."""
    engines = Engines({"small": "", "large": '"b"'})
    client, _ = gateways.open(policy, engines)
    lengths = (28, 10_000, 28, 10_000)

    async def scenario() -> tuple[list[int], float]:
        statuses: list[int] = []
        slowest = 0.0

        async def ask() -> None:
            for length in lengths:
                # 28 `a`s then a `c`: the worst case of the first alternative, no match.
                engines.answers["small"] = orjson.dumps("a" * length + "c" * (length < 100))
                body = orjson.dumps(chat("auto", BACKTRACKING))
                statuses.append(await asgi(client.app, "POST", "/v1/chat/completions", body))

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            while len(statuses) < len(lengths):
                # Asked now, sent after a millisecond's pause (which lets `ask` run: a
                # /healthz may be served without yielding): a loop held by a check shows
                # as a late answer.
                asked = time.perf_counter()
                await anyio.sleep(0.001)
                assert await asgi(client.app, "GET", "/healthz") == 200
                slowest = max(slowest, time.perf_counter() - asked)
        return statuses, slowest

    assert client.portal is not None
    statuses, slowest = client.portal.call(scenario)
    assert statuses == [502, 200, 502, 200]  # no tier's answer matches; 10,000 `a`s do
    assert engines.hosts == ["small", "large", "small", "small", "large", "small"]
    assert slowest < 0.05


def test_an_answer_too_costly_to_check_is_a_clear_400(
    policy: Policy, gateways: OpenGateways
) -> None:
    row = {
        "type": "object",
        "properties": {f"f{i}": {"type": "string", "pattern": "^[a-z]+$"} for i in range(5)},
        "required": [f"f{i}" for i in range(5)],
    }
    schema = {"type": "array", "items": row}
    answer = orjson.dumps([{f"f{i}": "abc" for i in range(5)}] * 2_000).decode()
    engines = Engines({"small": answer, "large": answer})
    client, _ = gateways.open(policy, engines)
    response = client.post("/v1/chat/completions", json=chat("auto", schema))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (CHAT_PARAM, "schema_too_costly")
    assert "10,000 keyword evaluations" in error["message"]
    assert engines.hosts == ["small"]  # not escalated: no tier's answer could be checked


def test_a_well_formed_schema_still_reaches_the_engine(
    policy: Policy, gateways: OpenGateways
) -> None:
    engines = Engines({"small": '{"label": "spam"}', "large": "{}"})
    client, _ = gateways.open(policy, engines)
    label = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"label": {"$ref": "#/$defs/label"}},
        "$defs": {"label": {"type": "string", "enum": ["spam", "ham"]}},
        "required": ["label"],
    }
    for model in ("small", "auto"):
        response = client.post("/v1/chat/completions", json=chat(model, label))
        assert response.status_code == 200
    assert engines.hosts == ["small", "small"]
