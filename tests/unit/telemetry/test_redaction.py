"""No key reaches a log line, the request log or a span attribute: `redact` on its own, the
logging filter `gateway serve` installs, and a whole run with keys and captured prompts."""

from __future__ import annotations

import logging
import logging.config
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.policy import parse_policy
from gateway.state.store import StateStore
from gateway.telemetry import names, redaction
from gateway.telemetry.redaction import (
    REDACTED,
    RedactingFilter,
    install_log_redaction,
    redact,
    redacting_log_config,
)
from tests.fakes import Call, FakeUpstream, Scripted
from tests.unit.edge.test_auth_keys import policy_text

KEY = "sk-agw-5d1e0c9b7a3f4e21"
PASTED = "sk-proj-Zq8vX2mN4bL6kJ9hG3fD"  # an upstream provider's key, pasted into a prompt
HEX_TOKEN = "9f86d081884c7d659a2feaa0c55ad015"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"Authorization: Bearer {KEY}", f"Authorization: Bearer {REDACTED}"),
        ("authorization: basic dXNlcjpwYXNzd29yZA==", f"authorization: basic {REDACTED}"),
        (f"my key is {PASTED}, keep it", f"my key is {REDACTED}, keep it"),
        (f"GET /v1/models?api_key={HEX_TOKEN}&x=1", f"GET /v1/models?api_key={REDACTED}&x=1"),
        (f"token={HEX_TOKEN}", f"token={REDACTED}"),
        (f'{{"api_key": "{HEX_TOKEN}"}}', f'{{"api_key": "{REDACTED}"}}'),
        (f'{{\\"secret\\": \\"{HEX_TOKEN}\\"}}', f'{{\\"secret\\": \\"{REDACTED}\\"}}'),
        (f"password: {HEX_TOKEN}", f"password: {REDACTED}"),
        ("redis://:hunter2@redis.internal:6379/0", f"redis://:{REDACTED}@redis.internal:6379/0"),
        ("rediss://app:s3cr3t@cache:6380", f"rediss://app:{REDACTED}@cache:6380"),
        ("(got 'https://u:p@h/x')", f"(got 'https://u:{REDACTED}@h/x')"),
    ],
)
def test_credentials_are_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "the task-runner finished; risk-assessment ok",
        "max_tokens=256 prompt_tokens: 1234",
        "key=short token: abc",
        "request 0af7651916cd43dd8448eb211c80319c routed to chat/a.test:1",
        "Bearer",
        "redis://redis.internal:6379/0 and http://user@host/path",
        "mailto:someone@example.com at 12:30",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) == text


FRAGMENTS = (
    "Bearer ", "basic ", "sk-", "api_key=", "API-KEY: ", "access_token", "refresh-token", "token",
    'secret="', "password: ", "passwd=", "key=", "Authorization:", '\\"', "'", " ", "\n", "x",
    "capital", "basically", "keys", "0123456789abcdefABCDEF_-.", "İ", "ß", "redis://:pw@h",
    "https://u:", "@", "://", "/",
)  # fmt: skip


def test_redaction_finds_what_the_whole_pattern_finds_everywhere() -> None:
    """`redact` tries the credential pattern only where a match may begin; on any text it
    must replace exactly what the pattern applied at every position would."""

    def everywhere(text: str) -> str:
        text = redaction._SECRET.sub(redaction._replace, text)
        return redaction._URL_PASSWORD.sub(rf"\g<userinfo>{REDACTED}", text)

    draw = random.Random(7)
    for _ in range(3000):
        text = "".join(draw.choice(FRAGMENTS) for _ in range(draw.randint(1, 24)))
        assert redact(text) == everywhere(text), text


def record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("gateway.test", logging.WARNING, __file__, 1, msg, args, exc_info)


def test_the_filter_redacts_message_arguments_and_traceback() -> None:
    try:
        raise ValueError(f"engine said: bad key {KEY}")
    except ValueError as caught:
        error = caught
    entry = record(
        "calling %s with %s (%d)", "http://a.test:1", {"api_key": HEX_TOKEN}, 3, exc=error
    )
    assert RedactingFilter().filter(entry) is True
    text = logging.Formatter("%(message)s").format(entry)
    assert "http://a.test:1" in text and "(3)" in text
    assert KEY not in text and HEX_TOKEN not in text
    assert "ValueError" in text and REDACTED in text


def test_uvicorn_access_lines_keep_their_fields_and_lose_the_key() -> None:
    """uvicorn's access formatter reads the record's arguments back one by one."""
    from uvicorn.logging import AccessFormatter

    entry = record(
        '%s - "%s %s HTTP/%s" %d',
        "127.0.0.1:5000",
        "GET",
        f"/v1/models?key={HEX_TOKEN}",
        "1.1",
        200,
    )
    RedactingFilter().filter(entry)
    line = AccessFormatter("%(client_addr)s %(request_line)s %(status_code)s").format(entry)
    assert line == f"127.0.0.1:5000 GET /v1/models?key={REDACTED} HTTP/1.1 200 OK"


def test_gateway_serve_puts_the_filter_on_every_handler(tmp_path: Path) -> None:
    from uvicorn.config import LOGGING_CONFIG

    config = redacting_log_config(LOGGING_CONFIG)
    assert all("redact" in handler["filters"] for handler in config["handlers"].values())
    assert "filters" not in LOGGING_CONFIG["handlers"]["default"]  # uvicorn's own untouched
    logger = logging.getLogger(f"agw-test-{uuid.uuid4().hex}")
    handler = logging.FileHandler(tmp_path / "log", encoding="utf-8")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        install_log_redaction(logger.name)
        install_log_redaction(logger.name)  # idempotent
        assert sum(isinstance(f, RedactingFilter) for f in handler.filters) == 1
        logger.warning("client sent Authorization: Bearer %s", "abc.defghijkl")  # split
    finally:
        handler.close()
        logger.removeHandler(handler)
    assert (tmp_path / "log").read_text() == f"client sent Authorization: Bearer {REDACTED}\n"


# -- a whole run -------------------------------------------------------------------------


def engine(call: Call) -> Scripted:
    """Echoes the prompt back, as a model repeating what it was told would."""
    said = orjson.loads(call.body)["messages"][-1]["content"]
    completion = {
        "id": "c1", "object": "chat.completion", "created": 1, "model": "served",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"noted: {said}"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }  # fmt: skip
    return Scripted(body=orjson.dumps(completion))


@dataclass
class Run:
    client: TestClient
    log: Path
    spans: InMemorySpanExporter
    closed: bool = False

    def close(self) -> None:  # drains the request log
        if not self.closed:
            self.closed = True
            self.client.__exit__(None, None, None)


@pytest.fixture
def run(redis_url: str, tmp_path: Path) -> Iterator[Run]:
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n")
    log = tmp_path / "requests.jsonl"
    policy = parse_policy(policy_text(redis_url, str(keys), str(log)))
    spans = InMemorySpanExporter()
    app = create_app(
        policy,
        upstream=FakeUpstream(engine),
        store=StateStore(policy.state),
        span_processor=SimpleSpanProcessor(spans),
    )
    client = TestClient(app)
    client.__enter__()
    opened = Run(client, log, spans)
    yield opened
    opened.close()


def test_no_key_reaches_a_log_line_the_request_log_or_a_span(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    client, log, spans = run.client, run.log, run.spans
    caplog.set_level(logging.DEBUG)
    caplog.handler.addFilter(RedactingFilter())  # as `gateway serve` installs it
    bearer = {"Authorization": f"Bearer {KEY}"}
    prompt = f"use {PASTED} and api_key={HEX_TOKEN} for the lookup"
    chat = {"model": "tiny", "messages": [{"role": "user", "content": prompt}]}
    response = client.post(
        "/v1/chat/completions",
        json=chat,
        headers={**bearer, "X-Request-Id": KEY, "X-Session-Id": f"{PASTED}-session"},
    )
    assert response.status_code == 200
    assert PASTED in response.text  # the client's own answer is not rewritten
    assert client.post("/v1/chat/completions", json=chat).status_code == 401
    assert (
        client.post("/v1/chat/completions", json={**chat, "model": 5}, headers=bearer).status_code
        == 400
    )
    logging.getLogger("gateway.pipeline").warning("engine answered: %s", prompt)
    run.close()

    logged = log.read_text()
    assert len(logged.splitlines()) == 3
    attributes = [dict(span.attributes or {}) for span in spans.get_finished_spans()]
    captured = " ".join(str(a.get(names.GEN_AI_INPUT_MESSAGES, "")) for a in attributes)
    assert "for the lookup" in captured and REDACTED in captured  # captured, but redacted
    everything = " ".join([logged, caplog.text, str(attributes)])
    everything += " ".join(r.getMessage() for r in caplog.records)
    for secret in (KEY, PASTED, HEX_TOKEN):
        assert secret not in everything
