"""API keys from a file: /v1 needs a valid bearer key, everything else stays open, the
file is re-read when it changes, and no key ever reaches a log or a span."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.policy import Policy, load_policy, parse_policy
from gateway.state.store import StateStore
from gateway.tenants.key_file import FileKeyStore, KeysFileError, parse_keys
from tests.fakes import Call, FakeUpstream, Scripted
from tests.policies import with_redis

KEY = "sk-agw-9f2c41d7e0b84a51"
OTHER_KEY = "sk-agw-team-b-77aa01"
NEW_KEY = "sk-agw-rotated-5e5e5e"
# Surrounding whitespace and a Windows line end are tolerated around a key.
KEYS_FILE = f"# API keys of the gateway (a Kubernetes Secret)\n\n{KEY}\n   {OTHER_KEY}   \r\n"
COMPLETION = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"served",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"fine"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
)
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
UNAUTHORIZED = {
    "error": {
        "message": "Missing or invalid API key: send `Authorization: Bearer <key>` (or "
        "`x-api-key: <key>`) with a key this gateway accepts.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


def policy_text(redis_url: str, keys_file: str, request_log: str) -> str:
    policy = f"""\
version: 1
auth: {{keys_file: "{keys_file}", check_interval_s: 0.05}}
telemetry:
  request_log: "{request_log}"
  traces: {{sample_ratio: 1.0, capture_content: true}}
pools:
  chat:
    served_model: served
    replicas: [{{url: "http://a.test:1"}}]
models:
  tiny: {{pool: chat}}
"""
    return with_redis(policy, redis_url)


@dataclass
class Gateway:
    client: TestClient
    fake: FakeUpstream
    keys: Path
    request_log: Path
    spans: InMemorySpanExporter
    closed: bool = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.__exit__(None, None, None)


def answered(call: Call) -> Scripted:
    return Scripted(body=COMPLETION)


@pytest.fixture
def gateway(redis_url: str, tmp_path: Path) -> Iterator[Gateway]:
    keys = tmp_path / "keys"
    keys.write_text(KEYS_FILE)
    request_log = tmp_path / "requests.jsonl"
    policy = parse_policy(policy_text(redis_url, str(keys), str(request_log)))
    fake = FakeUpstream(answered)
    spans = InMemorySpanExporter()
    app = create_app(
        policy,
        upstream=fake,
        store=StateStore(policy.state),
        span_processor=SimpleSpanProcessor(spans),
    )
    client = TestClient(app)
    client.__enter__()
    opened = Gateway(client, fake, keys, request_log, spans)
    yield opened
    opened.close()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_request_without_a_key_is_refused_in_openais_shape(gateway: Gateway) -> None:
    response = gateway.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["x-request-id"]
    assert gateway.fake.calls == []


def test_wrong_malformed_and_missing_keys_get_the_same_answer(gateway: Gateway) -> None:
    attempts = [
        {},
        bearer("sk-agw-guess"),
        bearer(KEY[:-1]),
        {"Authorization": KEY},  # no scheme
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": "Bearer "},
    ]
    bodies = set()
    for headers in attempts:
        response = gateway.client.post(
            "/v1/chat/completions", json=CHAT, headers={**headers, "X-Request-Id": "same"}
        )
        assert response.status_code == 401
        bodies.add(response.content)
    assert len(bodies) == 1
    assert gateway.fake.calls == []


def test_a_listed_key_passes_on_every_v1_route(gateway: Gateway) -> None:
    client = gateway.client
    for key in (KEY, OTHER_KEY):
        response = client.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
        assert response.status_code == 200
        assert response.content == COMPLETION
    assert (
        client.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": f"bearer {KEY}"}
        ).status_code
        == 200
    )
    assert client.get("/v1/models", headers=bearer(KEY)).status_code == 200
    assert client.get("/v1/usage", headers=bearer(KEY)).status_code == 200
    # Past the key check either way: the session exists only if another test left it in
    # the shared Redis (a clean-clone CI run saw the 404).
    checkpoints = client.get("/v1/sessions/s1/checkpoints", headers=bearer(KEY))
    assert checkpoints.status_code == 200 or (
        checkpoints.status_code == 404
        and checkpoints.json()["error"]["code"] == "session_not_found"
    ), checkpoints.text


def test_fastapi_routes_under_v1_are_guarded_too(gateway: Gateway) -> None:
    client = gateway.client
    for method, path in [
        ("GET", "/v1/models"),
        ("GET", "/v1/models/tiny"),
        ("GET", "/v1/usage"),
        ("GET", "/v1/sessions/s1/checkpoints"),
        ("DELETE", "/v1/sessions/s1"),
        ("GET", "/v1/responses/resp_1"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/embeddings"),
        ("GET", "/v1/no-such-route"),  # no hint about which routes exist either
    ]:
        response = client.request(method, path)
        assert (response.status_code, response.json()) == (401, UNAUTHORIZED), path


def test_health_readiness_metrics_and_dashboard_stay_open(gateway: Gateway) -> None:
    client = gateway.client
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 200
    assert client.get("/dashboard").status_code == 200


def test_the_openai_sdk_works_with_a_key_and_fails_without(gateway: Gateway) -> None:
    base = "http://testserver/v1"
    good = openai.OpenAI(base_url=base, api_key=KEY, http_client=gateway.client, max_retries=0)
    reply = good.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "fine"
    assert [m.id for m in good.models.list()] == ["tiny"]
    bad = openai.OpenAI(
        base_url=base, api_key="sk-wrong", http_client=gateway.client, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def replace_atomically(path: Path, text: str) -> None:
    """As the kubelet updates a Secret volume: the new file is renamed into place."""
    staged = path.with_name(path.name + ".new")
    staged.write_text(text)
    staged.replace(path)


def test_a_rotated_keys_file_is_picked_up(gateway: Gateway) -> None:
    client = gateway.client

    def status(key: str) -> int:
        return client.get("/v1/models", headers=bearer(key)).status_code

    assert (status(KEY), status(NEW_KEY)) == (200, 401)
    replace_atomically(gateway.keys, f"{NEW_KEY}\n")
    wait_until(lambda: status(NEW_KEY) == 200, "the new key was never accepted")
    assert status(KEY) == 401
    gateway.keys.write_text(f"# edited in place\n{KEY}\n")
    wait_until(lambda: status(KEY) == 200, "an in-place edit was never picked up")
    assert status(NEW_KEY) == 401


def test_an_unreadable_file_keeps_the_last_keys_and_an_empty_one_refuses_all(
    gateway: Gateway,
) -> None:
    client = gateway.client
    gateway.keys.unlink()  # mid-rotation: the file is briefly gone
    time.sleep(0.2)
    assert client.get("/v1/models", headers=bearer(KEY)).status_code == 200
    gateway.keys.write_text("# every key revoked\n")
    wait_until(
        lambda: client.get("/v1/models", headers=bearer(KEY)).status_code == 401,
        "an emptied keys file kept accepting keys",
    )


def test_no_key_reaches_the_request_log_logs_or_spans(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = gateway.client
    assert client.post("/v1/chat/completions", json=CHAT, headers=bearer(KEY)).status_code == 200
    assert (
        client.post("/v1/chat/completions", json=CHAT, headers=bearer(OTHER_KEY + "x")).status_code
        == 401
    )
    replace_atomically(gateway.keys, f"{NEW_KEY}\nnot a key\n")
    wait_until(
        lambda: client.get("/v1/models", headers=bearer(NEW_KEY)).status_code == 200,
        "the new key was never accepted",
    )
    gateway.close()  # drains the request log
    logged = gateway.request_log.read_text()
    assert len(logged.splitlines()) == 2
    assert '"status":401' in logged
    spans = " ".join(
        str(dict(span.attributes or {})) for span in gateway.spans.get_finished_spans()
    )
    assert spans
    for secret in (KEY, OTHER_KEY, NEW_KEY, "Bearer"):
        assert secret not in logged
        assert secret not in caplog.text
        assert secret not in spans


def test_a_keys_file_that_cannot_be_read_stops_the_gateway_from_starting(
    redis_url: str, tmp_path: Path
) -> None:
    policy = parse_policy(policy_text(redis_url, str(tmp_path / "absent"), str(tmp_path / "l")))
    with pytest.raises(KeysFileError, match="absent"):
        create_app(policy, upstream=FakeUpstream(answered))


def test_the_keys_file_path_is_relative_to_the_policy_and_takes_the_environment(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = policy_text(redis_url, "${GATEWAY_API_KEYS_FILE:-}", "requests.jsonl")
    (tmp_path / "policy.yaml").write_text(text)
    assert load_policy(tmp_path / "policy.yaml").auth.keys_file == ""
    monkeypatch.setenv("GATEWAY_API_KEYS_FILE", "secrets/keys")
    policy: Policy = load_policy(tmp_path / "policy.yaml")
    assert policy.auth.keys_file == str(tmp_path / "secrets" / "keys")


def test_only_digests_of_the_keys_are_held(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEYS_FILE + "two words\n#comment-only\n")
    keys = parse_keys(path.read_text())
    assert len(keys) == 2
    assert all(isinstance(digest, bytes) and len(digest) == 32 for digest in keys)
    store = FileKeyStore(path, check_interval_s=1)
    assert KEY not in repr(vars(store))
    identity = store.identify(KEY.encode())
    assert identity is not None and len(identity.key_id) == 12
    assert store.identify(b"two words") is None
    assert store.identify(b"#comment-only") is None


def test_anthropic_clients_send_their_key_in_x_api_key_and_are_refused_in_their_shape(
    gateway: Gateway,
) -> None:
    """Anthropic's SDKs send `x-api-key`; a refusal on the Messages API is Anthropic's
    `authentication_error`, with the same status and header as OpenAI's."""
    message = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    refused = gateway.client.post("/v1/messages", json=message, headers={"x-api-key": "sk-guess"})
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    body = refused.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert gateway.fake.calls == []
    served = gateway.client.post("/v1/messages", json=message, headers={"x-api-key": KEY})
    assert served.status_code == 200, served.text
    assert served.json()["type"] == "message"
    chat = gateway.client.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": KEY})
    assert chat.status_code == 200
