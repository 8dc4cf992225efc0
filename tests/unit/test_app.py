"""The HTTP surface with the engine replaced by its in-memory twin: routing, request ids,
error mapping, size limits, failover on refused connections, readiness."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.offline.replay.traces import read_trace
from gateway.policy import Policy, parse_policy
from gateway.runtime import current
from gateway.state.store import StateStore
from tests.fakes import Call, FakeUpstream, Scripted
from tests.unit.clients import OpenGateways

POLICY = """\
version: 1
limits: {max_body_bytes: 2000}
timeouts: {first_byte_s: 0.5}
health: {retry_after_s: 4}
pools:
  chat:
    served_model: served-tiny
    replicas: [{url: "http://a.test:1"}, {url: "http://b.test:1"}]
  embed:
    served_model: e
    serves: [embeddings]
    replicas: [{url: "http://e.test:1"}]
models:
  tiny: {pool: chat}
  emb: {pool: embed}
"""
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = b'{"id":"c1","object":"chat.completion","choices":[]}'


@pytest.fixture
def policy(redis_url: str) -> Policy:
    return parse_policy(POLICY + f"state: {{redis_url: '{redis_url}'}}\n")


Client = Callable[[Callable[[Call], Scripted]], tuple[TestClient, FakeUpstream]]


@pytest.fixture
def make_client(policy: Policy) -> Iterator[Client]:
    gateways = OpenGateways()
    yield lambda script: gateways.open(policy, script)
    gateways.close_all()


def ok(call: Call) -> Scripted:
    return Scripted(body=COMPLETION)


def test_chat_is_forwarded_with_model_rewritten_and_reply_untouched(make_client: Client) -> None:
    client, fake = make_client(ok)
    response = client.post("/v1/chat/completions", json={**CHAT, "top_k": 5})
    assert response.status_code == 200
    assert response.content == COMPLETION
    sent = orjson.loads(fake.calls[0].body)
    assert sent == {**CHAT, "model": "served-tiny", "top_k": 5}
    assert fake.calls[0].url.endswith("/v1/chat/completions")
    assert response.headers["x-gateway-replica"].startswith("chat/")


def test_request_id_is_echoed_and_sent_upstream(make_client: Client) -> None:
    client, fake = make_client(ok)
    response = client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "trace-42"})
    assert response.headers["x-request-id"] == "trace-42"
    assert fake.calls[0].headers["X-Request-Id"] == "trace-42"


def test_request_id_is_generated_when_absent_or_unsafe(make_client: Client) -> None:
    client, fake = make_client(ok)
    first = client.post("/v1/chat/completions", json=CHAT).headers["x-request-id"]
    unsafe = client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "a b\tc"})
    assert len(first) == 32
    assert unsafe.headers["x-request-id"] != "a b\tc"
    assert fake.calls[1].headers["X-Request-Id"] == unsafe.headers["x-request-id"]


def test_errors_also_carry_the_request_id(make_client: Client) -> None:
    client, _ = make_client(ok)
    response = client.post("/v1/chat/completions", content=b"{", headers={"X-Request-Id": "r1"})
    assert response.status_code == 400
    assert response.headers["x-request-id"] == "r1"


def test_completions_and_embeddings_reach_their_pools(make_client: Client) -> None:
    client, fake = make_client(ok)
    assert client.post("/v1/completions", json={"model": "tiny", "prompt": "x"}).status_code == 200
    assert client.post("/v1/embeddings", json={"model": "emb", "input": "x"}).status_code == 200
    assert fake.calls[0].url.startswith(("http://a.test:1", "http://b.test:1"))
    assert fake.calls[0].url.endswith("/v1/completions")
    assert fake.calls[1].url == "http://e.test:1/v1/embeddings"


def test_unknown_model_is_404(make_client: Client) -> None:
    client, fake = make_client(ok)
    response = client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    assert "tiny" in error["message"]
    assert fake.calls == []


def test_model_that_does_not_serve_the_endpoint_is_404(make_client: Client) -> None:
    client, _ = make_client(ok)
    response = client.post("/v1/chat/completions", json={**CHAT, "model": "emb"})
    assert response.status_code == 404
    assert "does not serve /v1/chat/completions" in response.json()["error"]["message"]


def test_oversize_body_is_413_by_content_length_and_by_stream(make_client: Client) -> None:
    client, fake = make_client(ok)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    assert client.post("/v1/chat/completions", json=big).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
        yield orjson.dumps(big)

    response = client.post("/v1/chat/completions", content=chunks())
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert fake.calls == []


def test_refused_replica_is_skipped_and_marked_down(make_client: Client) -> None:
    def script(call: Call) -> Scripted:
        return (
            Scripted(connect_refused=True)
            if call.url.startswith("http://a.test")
            else Scripted(body=COMPLETION)
        )

    client, fake = make_client(script)
    for _ in range(4):
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    # a.test was tried at most once: after refusing, it left the rotation.
    assert sum(c.url.startswith("http://a.test") for c in fake.calls) == 1
    ready = client.get("/readyz").json()
    assert ready["models"]["tiny"]["healthy_replicas"] == 1


def test_no_reachable_replica_is_503_with_retry_after(make_client: Client) -> None:
    client, _ = make_client(lambda call: Scripted(connect_refused=True))
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "4"
    assert response.json()["error"]["code"] == "no_healthy_replica"
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["not_ready"] == ["tiny"]


def test_engine_4xx_passes_through_with_its_message(make_client: Client) -> None:
    body = b'{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":"max_tokens","code":400}}'
    client, _ = make_client(lambda call: Scripted(status=400, body=body))
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "max_tokens is too large"
    assert response.json()["error"]["param"] == "max_tokens"


def test_engine_5xx_is_502(make_client: Client) -> None:
    client, _ = make_client(lambda call: Scripted(status=500, body=b"Internal Server Error"))
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_error"


def test_engine_that_does_not_answer_in_time_is_504(make_client: Client) -> None:
    client, _ = make_client(lambda call: Scripted(post_delay_s=2.0))
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"


def test_stream_is_relayed_event_by_event(make_client: Client) -> None:
    events = [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]
    raw = b"".join(events)
    client, fake = make_client(
        lambda call: Scripted(
            chunks=[raw[:5], raw[5:20], raw[20:]], content_type="text/event-stream"
        )
    )
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        body = b"".join(response.iter_raw())
    assert body == raw
    assert fake.calls[0].headers["Accept"] == "text/event-stream"
    assert fake.responses[0].released


def test_stream_broken_mid_way_ends_with_an_error_event(make_client: Client) -> None:
    chunks = [b'data: {"n":1}\n\n', b'data: {"n":2}\n\ndata: {"partial']
    client, fake = make_client(lambda call: Scripted(chunks=chunks, break_after=2))
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        body = b"".join(response.iter_raw())
    events = body.split(b"\n\n")
    assert events[0] == b'data: {"n":1}'
    assert events[1] == b'data: {"n":2}'
    error = orjson.loads(events[2].removeprefix(b"data: "))
    assert error["error"]["type"] == "upstream_error"
    assert b"[DONE]" not in body
    assert fake.responses[0].aborted


def test_method_not_allowed_and_unknown_route_are_openai_shaped(make_client: Client) -> None:
    client, _ = make_client(ok)
    assert client.get("/v1/chat/completions").json()["error"]["code"] == "method_not_allowed"
    missing = client.get("/v1/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "invalid_request_error"


def test_a_bug_on_the_request_path_is_a_500_without_internals(make_client: Client) -> None:
    def broken(call: Call) -> Scripted:
        raise RuntimeError("secret internal detail")

    client, _ = make_client(broken)
    response = client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "bug-1"})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error"
    assert "secret" not in response.text
    assert response.headers["x-request-id"] == "bug-1"
    assert 'status="500"' in client.get("/metrics").text


def test_models_lists_the_policy_aliases(make_client: Client) -> None:
    client, _ = make_client(ok)
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == ["emb", "tiny"]
    assert client.get("/v1/models/tiny").json()["id"] == "tiny"
    assert client.get("/v1/models/nope").status_code == 404
    assert "max_model_len" not in client.get("/v1/models/tiny").json()  # no engine has said


def test_models_carry_the_context_window_their_engines_report(make_client: Client) -> None:
    client, _ = make_client(ok)
    fleet = current(client.app.state).fleet  # type: ignore[attr-defined]
    for pool in fleet.pools.values():
        for replica in pool.replicas:
            replica.context_tokens = 16384  # what the health monitor reads from /v1/models
    listing = client.get("/v1/models").json()
    assert {m["id"]: m.get("max_model_len") for m in listing["data"]} == {
        "emb": 16384,
        "tiny": 16384,
    }
    assert client.get("/v1/models/tiny").json()["max_model_len"] == 16384


def test_health_and_readiness(make_client: Client) -> None:
    client, _ = make_client(ok)
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["state_store"] == "ok"


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe\x00garbage",
        b"[" * 5000 + b"]" * 5000,
        b'{"model": "tiny", "messages": [null]}',
        b'{"model": "tiny", "messages": [{"role": ["user"]}]}',
        b'{"model": {"$gt": ""}, "messages": []}',
        b'{"model": "tiny", "messages": [{"role": "user"}], "tools": "all"}',
        b'{"model": "tiny", "messages": [{"role": "user"}], "stream_options": [1]}',
        b'{"model": "tiny", "messages": [{"role": "user"}], "stream": null, "stream_options": {}}',
        b"1e999999",
        b'"just a string"',
    ],
)
def test_bad_input_is_a_clean_4xx_never_a_500(make_client: Client, body: bytes) -> None:
    client, fake = make_client(ok)
    response = client.post(
        "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
    )
    assert 400 <= response.status_code < 500
    error = response.json()["error"]
    assert error["message"]
    assert "Traceback" not in response.text
    assert fake.calls == []


def test_routing_is_explained_in_headers(make_client: Client) -> None:
    client, _ = make_client(ok)
    long_chat = {
        **CHAT,
        "messages": [
            {"role": "system", "content": "rules " * 250},
            {"role": "user", "content": "x"},
        ],
    }
    first = client.post("/v1/chat/completions", json=long_chat)
    second = client.post("/v1/chat/completions", json=long_chat)
    assert second.headers["x-gateway-replica"] == first.headers["x-gateway-replica"]
    assert second.headers["x-gateway-route"].startswith("prefix; cached_blocks=")


def test_tools_reach_the_engine_canonically_ordered(make_client: Client) -> None:
    client, fake = make_client(ok)
    tools = [
        {
            "type": "function",
            "function": {"name": n, "parameters": {"type": "object", "properties": {}}},
        }
        for n in ("zeta", "alpha")
    ]
    client.post("/v1/chat/completions", json={**CHAT, "tools": tools})
    sent = orjson.loads(fake.calls[0].body)
    assert [t["function"]["name"] for t in sent["tools"]] == ["alpha", "zeta"]
    assert list(sent["tools"][0]["function"]) == ["name", "parameters"]


def test_prefix_change_within_a_session_is_reported(make_client: Client) -> None:
    client, _ = make_client(ok)
    session = {"X-Session-Id": f"sess-{uuid.uuid4().hex}"}
    tool = {"type": "function", "function": {"name": "lookup"}}
    first = client.post("/v1/chat/completions", json={**CHAT, "tools": [tool]}, headers=session)
    same = client.post("/v1/chat/completions", json={**CHAT, "tools": [tool]}, headers=session)
    more_tools = client.post(
        "/v1/chat/completions",
        json={**CHAT, "tools": [tool, {"type": "function", "function": {"name": "book"}}]},
        headers=session,
    )
    assert "x-gateway-prefix-change" not in first.headers
    assert "x-gateway-prefix-change" not in same.headers
    assert more_tools.headers["x-gateway-prefix-change"] == "tools"
    metrics = client.get("/metrics").text
    assert 'gateway_prefix_changes_total{model="tiny",part="tools"} 1.0' in metrics
    assert "gateway_route_decisions_total" in metrics


def test_request_log_feeds_gateway_replay(redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "routes.jsonl"
    policy = parse_policy(
        POLICY + f"state: {{redis_url: '{redis_url}'}}\ntelemetry: {{request_log: '{log}'}}\n"
    )
    fake = FakeUpstream(ok)
    long_chat = {
        **CHAT,
        "messages": [
            {"role": "system", "content": "rules " * 250},
            {"role": "user", "content": "x"},
        ],
    }
    with TestClient(create_app(policy, upstream=fake, store=StateStore(policy.state))) as client:
        for _ in range(3):
            client.post("/v1/chat/completions", json=long_chat, headers={"X-Session-Id": "s1"})
        client.post("/v1/chat/completions", json=long_chat)  # no session id: derived
    entries = [orjson.loads(line) for line in log.read_text().splitlines()]
    assert len(entries) == 4
    assert entries[0]["session"] == "s1"
    assert entries[3]["session"].startswith("conv:")
    assert entries[0]["blocks"] == entries[3]["blocks"]
    assert entries[2]["cached_blocks"] == len(entries[2]["blocks"])
    trace = list(read_trace(log, block_tokens=128))
    assert [t.blocks for t in trace] == [tuple(e["blocks"]) for e in entries]
