"""Tiers over HTTP, engine replaced by its twin: the headers on every response, the cascade
escalating on an invalid answer and not on a valid one (whole and streamed), the error when
there is nowhere to go, and the counts in /metrics."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.policy import Policy
from gateway.runtime import current
from tests.fakes import Call, Scripted
from tests.policies import parse_with_redis
from tests.unit.clients import OpenGateways

POLICY = """\
version: 1
pools:
  small-pool: {tier: small, served_model: s, replicas: [{url: "http://small.test:1"}]}
  large-pool: {tier: large, served_model: l, replicas: [{url: "http://large.test:1"}]}
  plain-pool: {tier: small, served_model: s, structured_outputs: false,
               replicas: [{url: "http://plain.test:1"}]}
models:
  small: {pool: small-pool}
  auto: {tiering: default}
  auto-plain: {tiering: plain}
  auto-strict: {tiering: strict}
tiering:
  default:
    tiers: {small: small-pool, large: large-pool}
    learned: null
    rules:
      - {name: yes-no, when: {task: [classify]}, then: small}
  plain:
    tiers: {small: plain-pool, large: large-pool}
    learned: null
  strict:
    tiers: {small: small-pool, large: large-pool}
    learned: null
    guardrails: {enum: ["yes", "no"]}
    cascade: {on_fail: error}
"""
LABEL = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["spam", "ham"]}},
    "required": ["label"],
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "label", "schema": LABEL}}


def completion(text: str) -> bytes:
    return orjson.dumps({
        "id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
    })  # fmt: skip


def stream(text: str) -> list[bytes]:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}  # fmt: skip
    return [b"data: " + orjson.dumps(chunk) + b"\n\n", b"data: [DONE]\n\n"]


class Engines:
    """Answers per host: what each tier says."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.bodies: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, call: Call) -> Scripted:
        host = call.url.split("//")[1].split(".")[0]
        body = orjson.loads(call.body)
        self.bodies.append((host, body))
        text = self.answers[host]
        if body.get("stream"):
            return Scripted(chunks=stream(text), content_type="text/event-stream")
        return Scripted(body=completion(text))


@pytest.fixture
def policy(redis_url: str) -> Policy:
    return parse_with_redis(POLICY, redis_url)


def ask(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "spam?"}], **extra}


def test_every_response_names_its_tier_and_reason(policy: Policy, gateways: OpenGateways) -> None:
    engines = Engines({"small": "hi", "large": "hello"})
    client, _ = gateways.open(policy, engines)
    explicit = client.post("/v1/chat/completions", json=ask("small"))
    assert explicit.headers["x-gateway-tier"] == "small"
    assert explicit.headers["x-gateway-route-reason"] == "explicit model"
    default = client.post("/v1/chat/completions", json=ask("auto"))
    assert default.headers["x-gateway-tier"] == "large"
    assert default.headers["x-gateway-route-reason"] == "default tier"
    assert default.json()["choices"][0]["message"]["content"] == "hello"
    ruled = client.post("/v1/chat/completions", json=ask("auto"), headers={"X-Task": "classify"})
    assert ruled.headers["x-gateway-tier"] == "small"
    assert ruled.headers["x-gateway-route-reason"] == "rule:yes-no"
    assert [host for host, _ in engines.bodies] == ["small", "large", "small"]
    assert [body["model"] for _, body in engines.bodies] == ["s", "l", "s"]
    listed = {m["id"] for m in client.get("/v1/models").json()["data"]}
    assert {"auto", "small", "auto-plain"} <= listed


@pytest.mark.parametrize("streamed", [False, True])
def test_a_valid_answer_is_not_escalated(
    policy: Policy, gateways: OpenGateways, streamed: bool
) -> None:
    engines = Engines({"small": '{"label": "spam"}', "large": '{"label": "ham"}'})
    client, _ = gateways.open(policy, engines)
    response = client.post(
        "/v1/chat/completions", json=ask("auto", response_format=FORMAT, stream=streamed)
    )
    assert response.status_code == 200
    assert response.headers["x-gateway-tier"] == "small"
    assert response.headers["x-gateway-route-reason"] == "cascade: verifiable (response_format)"
    assert [host for host, _ in engines.bodies] == ["small"]
    if streamed:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.text.endswith("data: [DONE]\n\n")
        assert '{\\"label\\": \\"spam\\"}' in response.text
    else:
        assert response.json()["choices"][0]["message"]["content"] == '{"label": "spam"}'
    # The engine that can was asked to hold to the schema itself.
    assert engines.bodies[0][1]["response_format"] == FORMAT


@pytest.mark.parametrize("streamed", [False, True])
def test_an_invalid_answer_escalates_once_and_the_client_sees_one_answer(
    policy: Policy, gateways: OpenGateways, streamed: bool
) -> None:
    engines = Engines({"plain": "noise{", "large": '{"label": "ham"}'})
    client, _ = gateways.open(policy, engines)
    response = client.post(
        "/v1/chat/completions", json=ask("auto-plain", response_format=FORMAT, stream=streamed)
    )
    assert response.status_code == 200
    assert response.headers["x-gateway-tier"] == "large"
    reason = response.headers["x-gateway-route-reason"]
    assert reason == "cascade: small failed response_format, escalated to large"
    assert [host for host, _ in engines.bodies] == ["plain", "large"]
    # The engine without structured outputs got no schema; the large one did.
    assert "response_format" not in engines.bodies[0][1]
    assert engines.bodies[1][1]["response_format"] == FORMAT
    text = response.text
    assert "noise" not in text
    assert ("ham" in text) and (text.count("data: [DONE]") == (1 if streamed else 0))
    metrics = client.get("/metrics").text
    assert 'gateway_cascades_total{model="auto-plain",outcome="escalated"} 1.0' in metrics
    assert (
        'gateway_output_check_failures_total{check="response_format",model="auto-plain",'
        'tier="small"} 1.0'
    ) in metrics
    assert (
        'gateway_tier_decisions_total{by="escalation",model="auto-plain",tier="large"} 1.0'
        in metrics
    )


def test_a_failed_check_with_nowhere_to_go_is_a_clear_error(
    policy: Policy, gateways: OpenGateways
) -> None:
    engines = Engines({"small": "perhaps", "large": "yes"})
    client, _ = gateways.open(policy, engines)
    response = client.post("/v1/chat/completions", json=ask("auto-strict"))
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "output_check_failed"
    assert error["type"] == "upstream_error"
    assert "enum" in error["message"]
    assert "'perhaps' is not one of ['yes', 'no']" in error["message"]
    assert response.headers["x-gateway-tier"] == "small"
    # The engine was asked to choose from the enum (structured outputs).
    assert engines.bodies[0][1]["structured_outputs"] == {"choice": ["yes", "no"]}
    assert [host for host, _ in engines.bodies] == ["small"]


def test_a_checked_session_turn_is_checkpointed_once(
    policy: Policy, gateways: OpenGateways
) -> None:
    engines = Engines({"plain": "noise{", "large": '{"label": "ham"}'})
    client, _ = gateways.open(policy, engines)
    session = {"X-Session-Id": "tier-cascade-session"}
    client.delete("/v1/sessions/tier-cascade-session")
    response = client.post(
        "/v1/chat/completions", json=ask("auto-plain", response_format=FORMAT), headers=session
    )
    assert response.headers["x-gateway-session-turn"] == "1"
    turns = client.get("/v1/sessions/tier-cascade-session/checkpoints").json()["data"]
    assert len(turns) == 1


@pytest.mark.parametrize("streamed", [False, True])
def test_the_responses_api_goes_through_the_cascade(
    policy: Policy, gateways: OpenGateways, streamed: bool
) -> None:
    engines = Engines({"plain": "noise{", "large": '{"label": "ham"}'})
    client, _ = gateways.open(policy, engines)
    text_format = {"format": {"type": "json_schema", "name": "label", "schema": LABEL}}
    body = {"model": "auto-plain", "input": "spam?", "text": text_format, "stream": streamed}
    with client.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200
        assert response.headers["x-gateway-tier"] == "large"
        if streamed:
            events = [
                orjson.loads(line[6:])
                for line in response.iter_lines()
                if line.startswith("data: ")
            ]
            assert events[-1]["type"] == "response.completed"
            done = events[-1]["response"]
        else:
            done = orjson.loads(response.read())
    assert done["output"][0]["content"][0]["text"] == '{"label": "ham"}'
    assert [host for host, _ in engines.bodies] == ["plain", "large"]


TOO_LONG = orjson.dumps({"error": {"message": (
    "This model's maximum context length is 8192 tokens. However, your prompt contains at "
    "least 8193 input tokens, which exceeds this limit even without any output tokens."
), "type": "BadRequestError", "param": "input_tokens", "code": 400}})  # fmt: skip


@pytest.mark.parametrize("streamed", [False, True])
def test_a_prompt_the_small_tiers_window_cannot_hold_moves_to_a_tier_whose_window_can(
    policy: Policy, gateways: OpenGateways, streamed: bool
) -> None:
    """Small models often have small windows: a prompt the small tier's engines refuse as
    too long goes to the tier whose engines hold more (and says why); with no such tier the
    client hears the refusal, as `context_length_exceeded`."""
    seen: list[str] = []

    def engines(call: Call) -> Scripted:
        host = call.url.split("//")[1].split(".")[0]
        seen.append(host)
        if host == "small":
            return Scripted(status=400, body=TOO_LONG)
        if orjson.loads(call.body).get("stream"):
            return Scripted(chunks=stream("roomy"), content_type="text/event-stream")
        return Scripted(body=completion("roomy"))

    client, _ = gateways.open(policy, engines)
    fleet = current(client.app.state).fleet  # type: ignore[attr-defined]
    fleet.pools["small-pool"].replicas[0].context_tokens = 8192  # as /v1/models reports them
    fleet.pools["large-pool"].replicas[0].context_tokens = 32768
    ruled = {"X-Task": "classify"}  # the rule sends it to the small tier
    response = client.post("/v1/chat/completions", json=ask("auto", stream=streamed), headers=ruled)
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-tier"] == "large"
    assert response.headers["x-gateway-route-reason"] == (
        "window: small holds 8192 tokens, not the prompt; large 32768"
    )
    assert "roomy" in response.text
    assert seen == ["small", "large"]
    # Nowhere larger to go: the small tier's refusal, in the words agents act on.
    fleet.pools["large-pool"].replicas[0].context_tokens = 8192
    refused = client.post("/v1/chat/completions", json=ask("auto"), headers=ruled)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert seen == ["small", "large", "small"]


def test_a_conversation_that_outgrew_the_small_tiers_window_skips_it_on_later_turns(
    policy: Policy, gateways: OpenGateways
) -> None:
    """Histories grow: once the small tier refused a conversation's prompt, its later turns
    estimated as large (from that refusal's tokens per byte) go straight to the larger
    window instead of paying the refusal each turn; a smaller call of the same conversation,
    and other conversations, still go where they were chosen to."""
    seen: list[str] = []

    def engines(call: Call) -> Scripted:
        host = call.url.split("//")[1].split(".")[0]
        seen.append(host)
        return (
            Scripted(status=400, body=TOO_LONG)
            if host == "small"
            else Scripted(body=completion("roomy"))
        )

    client, _ = gateways.open(policy, engines)
    fleet = current(client.app.state).fleet  # type: ignore[attr-defined]
    fleet.pools["small-pool"].replicas[0].context_tokens = 8192
    fleet.pools["large-pool"].replicas[0].context_tokens = 32768
    ruled = {"X-Task": "classify"}
    first = [{"role": "system", "content": "You label mail."},
             {"role": "user", "content": "spam? " + "words " * 400}]  # fmt: skip
    later = [*first, {"role": "assistant", "content": "ham"},
             {"role": "user", "content": "and this? " + "words " * 50}]  # fmt: skip

    def turn(messages: list[dict[str, str]]) -> tuple[str, str]:
        body = {"model": "auto", "messages": messages}
        response = client.post("/v1/chat/completions", json=body, headers=ruled)
        assert response.status_code == 200, response.text
        return response.headers["x-gateway-tier"], response.headers["x-gateway-route-reason"]

    assert turn(first)[1] == "window: small holds 8192 tokens, not the prompt; large 32768"
    assert seen == ["small", "large"]
    tier, reason = turn(later)
    assert (tier, seen) == ("large", ["small", "large", "large"])
    assert reason.startswith("session: about ") and reason.endswith(
        " tokens, past small's 8192 (an earlier turn did not fit); large 32768"
    )
    # The same conversation's first call again, smaller than the refused one: small first.
    seen.clear()
    shorter = [first[0], {"role": "user", "content": "spam? " + "words " * 300}]
    turn(shorter)
    assert seen == ["small", "large"]
    # Another conversation (another first message) has no refusal on record.
    seen.clear()
    turn([first[0], {"role": "user", "content": "ham? " + "words " * 500}])
    assert seen == ["small", "large"]
