"""A gateway whose spans land in the SDK's in-memory exporter, in front of the engine's
twin, with a model alias of its own per test (usage counters live in the shared Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.state.store import StateStore
from tests.fakes import Call, FakeUpstream, Scripted
from tests.policies import parse_with_redis

POLICY = """\
version: 1
timeouts: {{first_byte_s: 1}}
telemetry:
  traces: {{sample_ratio: {ratio}, capture_content: {capture}}}
  usage: {{flush_interval_s: 60}}
  request_log: "{log}"
pools:
  small:
    served_model: served-small
    tier: small
    replicas: [{{url: "http://s.test:1"}}]
    price: {{input: 0.10, cached_input: 0.01, output: 0.40}}
  large:
    served_model: served-large
    tier: large
    replicas: [{{url: "http://l.test:1"}}, {{url: "http://l2.test:1"}}]
    price: {{input: 3.0, cached_input: 0.30, output: 15.0}}
models:
  {alias}: {{pool: large}}
  {alias}-auto: {{tiering: auto}}
tiering:
  auto:
    tiers: {{small: small, large: large}}
    learned: null
    rules:
      - name: classify
        when: {{task: [classify]}}
        then: small
    default_tier: large
"""


@dataclass
class Traced:
    client: TestClient
    fake: FakeUpstream
    spans: InMemorySpanExporter
    alias: str
    log: str


def completion(prompt: int = 100, cached: int = 60, output: int = 20) -> bytes:
    return (
        b'{"id":"chatcmpl-1","object":"chat.completion","model":"served-large",'
        b'"choices":[{"index":0,"message":{"role":"assistant","content":"fine"},'
        b'"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,'
        b'"prompt_tokens_details":{"cached_tokens":%d}}}'
        % (prompt, output, prompt + output, cached)
    )


def answered(call: Call) -> Scripted:
    return Scripted(body=completion())


OpenTraced = Callable[..., Traced]


@pytest.fixture
def traced(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenTraced]:
    opened: list[TestClient] = []

    def open_(
        script: Callable[[Call], Scripted] = answered, *, ratio: float = 1.0, capture: bool = False
    ) -> Traced:
        alias = f"m{uuid.uuid4().hex[:10]}"
        log = str(tmp_path_factory.mktemp("log") / "requests.jsonl")
        text = POLICY.format(ratio=ratio, capture=str(capture).lower(), alias=alias, log=log)
        policy = parse_with_redis(text, redis_url)
        exporter = InMemorySpanExporter()
        fake = FakeUpstream(script)
        app = create_app(
            policy,
            upstream=fake,
            store=StateStore(policy.state),
            span_processor=SimpleSpanProcessor(exporter),
        )
        client = TestClient(app)
        client.__enter__()
        opened.append(client)
        return Traced(client, fake, exporter, alias, log)

    yield open_
    for client in opened:
        client.__exit__(None, None, None)
