"""Retries, breakers, admission and fallbacks over HTTP, engine replaced by its twin."""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest

from gateway.api.inference import render
from gateway.errors import Overloaded
from gateway.fleet.engine_metrics import EngineLoad
from gateway.fleet.replicas import Fleet
from gateway.pipeline import Pipeline
from gateway.policy import Endpoint, Policy, parse_policy
from gateway.prompt.prefix_watch import MemoryFingerprints
from gateway.request_context import RequestContext
from gateway.resilience.dispatcher import Dispatcher
from gateway.resilience.response_cache import cache_key
from gateway.routing.router import RoundRobinRouter
from gateway.telemetry.metrics import GatewayMetrics
from tests.fakes import Call, FakeUpstream, Scripted
from tests.policies import parse_with_redis
from tests.unit.clients import OpenGateways

POLICY = """\
version: 1
health: {failures_to_unhealthy: 1000}
resilience:
  breaker: {consecutive_failures: 3, open_s: 60}
  retries: {attempts: 3, backoff_base_s: 0.001, backoff_max_s: 0.01, retry_after_cap_s: 0.05}
routing: {strategy: round_robin}
pools:
  main:
    served_model: m
    replicas: [{url: "http://a.test:1"}, {url: "http://b.test:1"}]
  spare:
    served_model: s
    replicas: [{url: "http://spare.test:1"}]
models:
  main: {pool: main, fallbacks: [spare]}
  spare: {pool: spare}
"""
ASK = {"model": "main", "messages": [{"role": "user", "content": "hi"}]}
OK = orjson.dumps({
    "id": "c", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "fine"}}],
})  # fmt: skip
BUSY = orjson.dumps({"error": {"message": "busy", "type": "x", "code": None}})


def host(call: Call) -> str:
    return call.url.split("//")[1].split(".")[0]


class Hosts:
    """Scripts per host; records which host each call went to."""

    def __init__(self, scripts: dict[str, Scripted]) -> None:
        self.scripts = scripts
        self.seen: list[str] = []

    def __call__(self, call: Call) -> Scripted:
        self.seen.append(host(call))
        return self.scripts[host(call)]


@pytest.fixture
def policy(redis_url: str) -> Policy:
    return parse_with_redis(POLICY, redis_url)


def test_a_503_is_retried_on_the_other_replica(policy: Policy, gateways: OpenGateways) -> None:
    hosts = Hosts({"a": Scripted(status=503, body=BUSY, retry_after="0"), "b": Scripted(body=OK)})
    client, _ = gateways.open(policy, hosts)
    response = client.post("/v1/chat/completions", json=ASK)
    assert response.status_code == 200
    assert response.headers["x-gateway-attempts"] == "2"
    assert hosts.seen == ["a", "b"]
    assert 'gateway_retries_total{pool="main"} 1.0' in client.get("/metrics").text


def test_a_429_storm_ends_in_a_clean_429(policy: Policy, gateways: OpenGateways) -> None:
    busy = Scripted(status=429, body=BUSY, retry_after="1")
    hosts = Hosts({"a": busy, "b": busy, "spare": busy})
    client, _ = gateways.open(policy, hosts)
    response = client.post("/v1/chat/completions", json=ASK)
    assert response.status_code == 429
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "overloaded")
    assert "busy" in error["message"]
    assert response.headers["retry-after"] == "1"
    assert len(hosts.seen) == 3 + 3  # every try on main, then every try on its fallback


def test_a_500_is_not_retried_and_the_fallback_answers(
    policy: Policy, gateways: OpenGateways
) -> None:
    hosts = Hosts({"a": Scripted(status=500, body=BUSY), "b": Scripted(status=500, body=BUSY),
                   "spare": Scripted(body=OK)})  # fmt: skip
    client, _ = gateways.open(policy, hosts)
    response = client.post("/v1/chat/completions", json=ASK)
    assert response.headers["x-gateway-fallback"] == "spare"
    assert len(hosts.seen) == 2


def test_client_errors_are_not_retried_and_do_not_trip_the_breaker(
    policy: Policy, gateways: OpenGateways
) -> None:
    bad = Scripted(status=400, body=BUSY)
    hosts = Hosts({"a": bad, "b": bad, "spare": bad})
    client, _ = gateways.open(policy, hosts)
    for _ in range(8):
        assert client.post("/v1/chat/completions", json=ASK).status_code == 400
    assert len(hosts.seen) == 8
    assert "gateway_breaker_transitions_total{" not in client.get("/metrics").text


TOO_LONG = orjson.dumps({"error": {"message": (
    "This model's maximum context length is 16384 tokens. However, your prompt contains at "
    "least 16385 input tokens, which exceeds this limit even without any output tokens."
), "type": "BadRequestError", "param": "input_tokens", "code": 400}})  # fmt: skip


def test_a_prompt_the_engines_window_cannot_hold_goes_to_the_fallback(
    policy: Policy, gateways: OpenGateways
) -> None:
    """A fallback model with a larger window can answer what this one's engines refuse as
    too long (LiteLLM's `context_window_fallbacks`); tried once per pool, not retried, not
    held against the replica. When none can, the client hears the first refusal."""
    hosts = Hosts({"a": Scripted(status=400, body=TOO_LONG), "spare": Scripted(body=OK)})
    client, _ = gateways.open(policy, hosts)
    response = client.post("/v1/chat/completions", json=ASK)
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-fallback"] == "spare"
    assert hosts.seen == ["a", "spare"]
    hosts = Hosts({"a": Scripted(status=400, body=TOO_LONG),
                   "spare": Scripted(status=400, body=TOO_LONG)})  # fmt: skip
    client, _ = gateways.open(policy, hosts)
    response = client.post("/v1/chat/completions", json=ASK)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert hosts.seen == ["a", "spare"]
    assert "gateway_breaker_transitions_total{" not in client.get("/metrics").text


def test_an_open_breaker_takes_the_replica_out(policy: Policy, gateways: OpenGateways) -> None:
    hosts = Hosts({"a": Scripted(status=503, body=BUSY), "b": Scripted(body=OK)})
    client, _ = gateways.open(policy, hosts)
    for _ in range(10):
        assert client.post("/v1/chat/completions", json=ASK).status_code == 200
    assert hosts.seen.count("a") == 3  # then the breaker opened: `a` is never tried again
    metrics = client.get("/metrics").text
    assert 'gateway_breaker_transitions_total{replica="main/' in metrics
    assert 'state="open"} 1.0' in metrics


def test_a_stream_that_breaks_counts_against_its_replica(
    policy: Policy, gateways: OpenGateways
) -> None:
    chunk = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
    broken = Scripted(chunks=[chunk], content_type="text/event-stream", break_after=1)
    hosts = Hosts({"a": broken, "b": broken})
    client, _ = gateways.open(policy, hosts)
    for _ in range(6):
        text = client.post("/v1/chat/completions", json={**ASK, "stream": True}).text
        assert '"error"' in text  # an error event, never a silent truncation
        assert "[DONE]" not in text
    assert client.get("/metrics").text.count('state="open"} 1.0') == 2


def test_when_every_replica_is_down_the_fallback_answers(
    policy: Policy, gateways: OpenGateways
) -> None:
    refused = Scripted(connect_refused=True)
    hosts = Hosts({"a": refused, "b": refused, "spare": Scripted(body=OK)})
    client, fake = gateways.open(policy, hosts)
    response = client.post("/v1/chat/completions", json=ASK)
    assert response.status_code == 200
    assert response.headers["x-gateway-fallback"] == "spare"
    assert orjson.loads(fake.calls[-1].body)["model"] == "s"
    assert (
        'gateway_fallbacks_total{fallback="spare",model="main"} 1.0' in client.get("/metrics").text
    )


class Held(FakeUpstream):
    """Streams that stay open until the test ends them: slots stay taken."""

    def __init__(self) -> None:
        super().__init__(lambda call: Scripted(chunks=[], content_type="text/event-stream"))
        self.gate: asyncio.Event = asyncio.Event()

    async def post(self, url, body, headers, *, connect_timeout_s):  # type: ignore[no-untyped-def]
        response = await super().post(url, body, headers, connect_timeout_s=connect_timeout_s)
        gate = self.gate

        async def next_chunk() -> bytes:
            await gate.wait()
            return b""

        response.next_chunk = next_chunk  # type: ignore[method-assign]
        return response


@pytest.mark.parametrize("mode", ["reject", "wait"])
async def test_a_full_pool_sheds_with_429_and_retry_after(mode: str) -> None:
    policy = parse_policy(
        POLICY.replace("routing:", f"  admission: {{max_inflight_per_replica: 1, "
                       f"on_saturated: {mode}, wait_s: 0.05, retry_after_s: 3}}\nrouting:")
    )  # fmt: skip
    upstream = Held()
    metrics = GatewayMetrics()
    pipeline = Pipeline(
        policy, Fleet(policy), RoundRobinRouter(), upstream,
        fingerprints=MemoryFingerprints(), metrics=metrics,
    )  # fmt: skip
    body = orjson.dumps({**ASK, "model": "spare", "stream": True})
    await pipeline.handle(Endpoint.chat, body, RequestContext("r1"))  # holds spare's slot
    with pytest.raises(Overloaded) as shed:
        await pipeline.handle(Endpoint.chat, body, RequestContext("r2"))
    assert shed.value.status == 429
    assert shed.value.headers["Retry-After"] == "3"
    assert len(upstream.calls) == 1  # the full replica was not asked


def test_the_kept_answer_of_a_deterministic_request_is_the_last_fallback(
    redis_url: str, gateways: OpenGateways
) -> None:
    policy = parse_with_redis(
        POLICY.replace("routing:", "  response_cache: {enabled: true, ttl_s: 60}\nrouting:"),
        redis_url,
    )
    up = {"a": Scripted(body=OK), "b": Scripted(body=OK), "spare": Scripted(body=OK)}
    hosts = Hosts(up)
    client, _ = gateways.open(policy, hosts)
    question = f"deterministic {uuid.uuid4().hex}"
    ask = {**ASK, "temperature": 0, "messages": [{"role": "user", "content": question}]}
    first = client.post("/v1/chat/completions", json=ask)
    assert first.status_code == 200
    assert "x-gateway-fallback" not in first.headers
    for name in up:  # now nothing can answer
        hosts.scripts[name] = Scripted(connect_refused=True)
    again = client.post("/v1/chat/completions", json=ask)
    assert again.status_code == 200
    assert again.headers["x-gateway-fallback"] == "cache"
    assert again.content == first.content
    # Sampled requests, and other questions, are never served from it.
    sampled = client.post("/v1/chat/completions", json={**ask, "temperature": 0.7})
    assert sampled.status_code == 503
    other = {**ask, "messages": [{"role": "user", "content": "another"}]}
    assert client.post("/v1/chat/completions", json=other).status_code == 503


@pytest.mark.parametrize(
    ("body", "keyed"),
    [
        ({"model": "m", "messages": [], "temperature": 0}, True),
        ({"model": "m", "messages": [], "temperature": 0, "n": 1, "user": "u"}, True),
        ({"model": "m", "messages": []}, False),
        ({"model": "m", "messages": [], "temperature": 0, "stream": True}, False),
        ({"model": "m", "messages": [], "temperature": 0, "n": 2}, False),
    ],
)
def test_only_deterministic_requests_have_a_cache_key(body: dict[str, object], keyed: bool) -> None:
    assert (cache_key(body) is not None) is keyed


def test_the_cache_key_ignores_key_order_and_the_user() -> None:
    one = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "x"}]}
    two = {"messages": [{"content": "x", "role": "user"}], "temperature": 0, "model": "m",
           "user": "someone"}  # fmt: skip
    assert cache_key(one) == cache_key(two)
    assert cache_key(one) != cache_key({**one, "model": "other"})


async def test_an_engine_whose_own_queue_is_full_counts_as_full() -> None:
    policy = parse_policy(POLICY.replace("routing: {strategy: round_robin}",
                                         "routing: {strategy: round_robin, max_waiting: 4}"))  # fmt: skip
    upstream = FakeUpstream(lambda call: Scripted(body=OK))
    metrics = GatewayMetrics()
    queues = {"http://a.test:1": EngineLoad(waiting=4), "http://b.test:1": EngineLoad(waiting=0)}
    router = RoundRobinRouter()
    pipeline = Pipeline(
        policy, Fleet(policy), router, upstream, fingerprints=MemoryFingerprints(),
        metrics=metrics,
        dispatcher=Dispatcher(policy, router, upstream, metrics, engine_load=queues.get),
    )  # fmt: skip
    body = orjson.dumps(ASK)
    for _ in range(3):  # only `b` has room
        await pipeline.handle(Endpoint.chat, body, RequestContext("r"))
    assert {host(call) for call in upstream.calls} == {"b"}
    queues["http://b.test:1"] = EngineLoad(waiting=9)  # now every engine of `main` is full
    shed = render(await pipeline.handle(Endpoint.chat, body, RequestContext("r")))
    assert shed.headers["x-gateway-fallback"] == "spare"  # shed from main, served by its fallback
    queues["http://spare.test:1"] = EngineLoad(waiting=4)
    with pytest.raises(Overloaded):
        await pipeline.handle(Endpoint.chat, body, RequestContext("r"))
