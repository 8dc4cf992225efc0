"""Sessions over HTTP, engine replaced by its twin, Redis real: checkpoints per turn,
delta hydration, time travel, fork and delete, two gateways sharing one session."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.chat.replies import normalise
from gateway.policy import Policy, parse_policy
from gateway.runtime import current
from gateway.trimming.tokens import message_text, token_counter
from tests.fakes import Call, FakeUpstream, Scripted
from tests.unit.clients import OpenGateways

POLICY = """\
version: 1
pools:
  chat:
    served_model: served-tiny
    replicas: [{url: "http://a.test:1"}]
models:
  tiny: {pool: chat}
"""
SYSTEM = {"role": "system", "content": "Be brief."}


def completion(text: str) -> bytes:
    return orjson.dumps({
        "id": "c", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text, "refusal": None}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
    })  # fmt: skip


def stream(*parts: str) -> list[bytes]:
    events = [
        b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": p}}]}) + b"\n\n"
        for p in parts
    ]
    return [*events, b"data: [DONE]\n\n"]


def echo(call: Call) -> Scripted:
    """Answers with the number of messages it was sent: shows what the engine saw."""
    body = orjson.loads(call.body)
    reply = f"seen {len(body['messages'])}"
    if body.get("stream"):
        return Scripted(chunks=stream("seen ", str(len(body["messages"]))),
                        content_type="text/event-stream")  # fmt: skip
    return Scripted(body=completion(reply))


@pytest.fixture
def policy(redis_url: str) -> Policy:
    return parse_policy(POLICY + f"state: {{redis_url: '{redis_url}'}}\n")


Gateway = Callable[..., tuple[TestClient, FakeUpstream]]


@pytest.fixture
def gateway(policy: Policy) -> Iterator[Gateway]:
    gateways = OpenGateways()

    def make(
        script: Callable[[Call], Scripted] = echo, policy_override: Policy | None = None
    ) -> tuple[TestClient, FakeUpstream]:
        return gateways.open(policy_override or policy, script)

    yield make
    gateways.close_all()


def session_headers(**extra: str) -> dict[str, str]:
    return {"X-Session-Id": f"s-{uuid.uuid4().hex}", **extra}


def chat(client: TestClient, messages: list[Any], headers: dict[str, str], **body: Any) -> Any:
    response = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": messages, **body},
        headers=headers,
    )
    assert response.status_code == 200, response.text
    return response


def stream_chat(client: TestClient, messages: list[Any], headers: dict[str, str]) -> list[str]:
    """A streamed chat request; the non-empty lines the client received."""
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "tiny", "messages": messages, "stream": True},
        headers=headers,
    ) as response:
        return [line for line in response.iter_lines() if line]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_each_turn_is_checkpointed_with_only_what_it_added(gateway: Gateway) -> None:
    client, _ = gateway()
    headers = session_headers()
    first = chat(client, [SYSTEM, user("a")], headers)
    assert first.headers["x-gateway-session-turn"] == "1"
    reply = first.json()["choices"][0]["message"]  # resent as the SDK returned it
    second = chat(client, [SYSTEM, user("a"), reply, user("b")], headers)
    assert second.headers["x-gateway-session-turn"] == "2"

    listing = client.get(f"/v1/sessions/{headers['X-Session-Id']}/checkpoints").json()
    assert [(c["turn"], c["new_messages"], c["rewrite"]) for c in listing["data"]] == [
        (1, 2, False),
        (2, 1, False),
    ]
    assert listing["data"][1]["usage"]["prompt_tokens"] == 7
    assert listing["data"][1]["route"]["reason"] in ("prefix", "session", "load", "rotation")


def test_delta_mode_sends_the_engine_the_whole_conversation(gateway: Gateway) -> None:
    client, fake = gateway()
    headers = session_headers()
    chat(client, [SYSTEM, user("a")], headers)
    second = chat(client, [user("b")], {**headers, "X-Context-Mode": "delta"})
    assert second.json()["choices"][0]["message"]["content"] == "seen 4"
    sent = orjson.loads(fake.calls[1].body)["messages"]
    assert sent == [SYSTEM, user("a"), {"role": "assistant", "content": "seen 2"}, user("b")]


def test_time_travel_shows_exactly_what_the_engine_was_sent(gateway: Gateway) -> None:
    client, fake = gateway()
    headers = session_headers()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chat(client, [SYSTEM, user("a")], headers, tools=tools, temperature=0)
    chat(client, [user("b")], {**headers, "X-Context-Mode": "delta"}, tools=tools)
    sid = headers["X-Session-Id"]
    for turn in (1, 2):
        checkpoint = client.get(f"/v1/sessions/{sid}/checkpoints/{turn}").json()
        sent = orjson.loads(fake.calls[turn - 1].body)
        assert checkpoint["engine_request"] == {
            **sent,
            "messages": [normalise(m) for m in sent["messages"]],
        }
        assert checkpoint["reply"] == {"role": "assistant", "content": f"seen {2 * turn}"}
    missing = client.get(f"/v1/sessions/{sid}/checkpoints/3")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "checkpoint_not_found"


def test_a_streamed_turn_is_checkpointed_before_done(gateway: Gateway) -> None:
    client, _ = gateway()
    headers = session_headers()
    events = stream_chat(client, [user("a")], headers)
    assert events[-1] == "data: [DONE]"
    turns = client.get(f"/v1/sessions/{headers['X-Session-Id']}/checkpoints/1").json()
    assert turns["reply"] == {"role": "assistant", "content": "seen 1"}


def test_a_streamed_turn_keeps_its_usage_without_showing_the_client(gateway: Gateway) -> None:
    def with_usage(call: Call) -> Scripted:
        assert orjson.loads(call.body)["stream_options"] == {"include_usage": True}
        usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
        chunks = stream("ok")
        return Scripted(chunks=[*chunks[:-1], usage, chunks[-1]], content_type="text/event-stream")

    client, _ = gateway(with_usage)
    headers = session_headers()
    body = "".join(stream_chat(client, [user("a")], headers))
    assert "usage" not in body  # the client did not ask for it
    listing = client.get(f"/v1/sessions/{headers['X-Session-Id']}/checkpoints").json()
    assert listing["data"][0]["usage"] == {"prompt_tokens": 3, "completion_tokens": 1}


def test_a_failed_turn_leaves_the_previous_checkpoint(gateway: Gateway) -> None:
    def breaks_on_second(call: Call) -> Scripted:
        if len(orjson.loads(call.body)["messages"]) > 1:
            return Scripted(chunks=stream("x", "y"), break_after=1,
                            content_type="text/event-stream")  # fmt: skip
        return echo(call)

    client, _ = gateway(breaks_on_second)
    headers = session_headers()
    chat(client, [user("a")], headers)
    body = "".join(stream_chat(client, [user("b")], {**headers, "X-Context-Mode": "delta"}))
    assert "upstream_error" in body
    listing = client.get(f"/v1/sessions/{headers['X-Session-Id']}/checkpoints").json()
    assert len(listing["data"]) == 1


def test_fork_then_continue_and_delete(gateway: Gateway) -> None:
    client, fake = gateway()
    headers = session_headers()
    sid = headers["X-Session-Id"]
    chat(client, [user("a")], headers)
    chat(client, [user("b")], {**headers, "X-Context-Mode": "delta"})
    forked = client.post(f"/v1/sessions/{sid}/fork", json={"turn": 1})
    assert forked.status_code == 201
    new_id = forked.json()["id"]
    assert forked.json()["forked_from"] == {"session_id": sid, "turn": 1}
    chat(client, [user("c")], {"X-Session-Id": new_id, "X-Context-Mode": "delta"})
    sent = orjson.loads(fake.calls[-1].body)["messages"]
    assert sent == [user("a"), {"role": "assistant", "content": "seen 1"}, user("c")]

    assert client.delete(f"/v1/sessions/{sid}").json()["deleted"] is True
    gone = client.get(f"/v1/sessions/{sid}/checkpoints")
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "session_not_found"
    assert client.delete(f"/v1/sessions/{sid}").status_code == 404
    bad_turn = client.post(f"/v1/sessions/{new_id}/fork", json={"turn": 9})
    assert bad_turn.status_code == 400
    assert bad_turn.json()["error"]["param"] == "turn"


def test_a_fork_onto_an_existing_session_is_409_and_leaves_it_whole(gateway: Gateway) -> None:
    client, _ = gateway()
    source, victim = session_headers(), session_headers()
    chat(client, [user("a")], source)
    for text in ("x", "y", "z"):
        chat(client, [user(text)], {**victim, "X-Context-Mode": "delta"})
    victim_id = victim["X-Session-Id"]
    refused = client.post(
        f"/v1/sessions/{source['X-Session-Id']}/fork", json={"turn": 1, "session_id": victim_id}
    )
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "session_exists",
        "session_id",
    )
    assert victim_id in error["message"]
    kept = client.get(f"/v1/sessions/{victim_id}/checkpoints").json()["data"]
    assert [c["turn"] for c in kept] == [1, 2, 3]
    onto_itself = client.post(
        f"/v1/sessions/{victim_id}/fork", json={"turn": 1, "session_id": victim_id}
    )
    assert onto_itself.status_code == 400
    assert len(client.get(f"/v1/sessions/{victim_id}/checkpoints").json()["data"]) == 3


def test_a_fork_the_gateway_names_is_a_session_id_the_api_takes(gateway: Gateway) -> None:
    client, _ = gateway()
    longest = "s" * 200  # a session id is at most 200 characters; its fork's too
    chat(client, [user("a")], {"X-Session-Id": longest})
    forked = client.post(f"/v1/sessions/{longest}/fork", json={})
    assert forked.status_code == 201, forked.text
    fork_id = forked.json()["id"]
    assert len(fork_id) <= 200 and fork_id != longest
    assert client.get(f"/v1/sessions/{fork_id}/checkpoints").status_code == 200


def test_two_gateways_share_one_session(gateway: Gateway) -> None:
    first, _ = gateway()
    second, fake = gateway()
    headers = session_headers()
    chat(first, [SYSTEM, user("a")], headers)
    chat(second, [user("b")], {**headers, "X-Context-Mode": "delta"})
    assert len(orjson.loads(fake.calls[0].body)["messages"]) == 4


def test_delta_mode_needs_a_session_and_a_known_mode(gateway: Gateway) -> None:
    client, fake = gateway()
    no_session = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [user("a")]},
        headers={"X-Context-Mode": "delta"},
    )
    assert no_session.status_code == 400
    assert no_session.json()["error"]["code"] == "session_required"
    unknown = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [user("a")]},
        headers=session_headers(**{"X-Context-Mode": "sometimes"}),
    )
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "X-Context-Mode"
    bad_id = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [user("a")]},
        headers={"X-Session-Id": "not ok"},
    )
    assert bad_id.status_code == 400
    assert bad_id.json()["error"]["code"] == "invalid_session_id"
    assert fake.calls == []


def test_session_key_from_metadata_when_the_policy_says_so(
    gateway: Gateway, redis_url: str
) -> None:
    policy = parse_policy(
        POLICY + f"state: {{redis_url: '{redis_url}'}}\nsessions: {{key_from: [metadata]}}\n"
    )
    client, _ = gateway(policy_override=policy)
    sid = f"m-{uuid.uuid4().hex}"
    chat(client, [user("a")], {}, metadata={"session_id": sid})
    assert client.get(f"/v1/sessions/{sid}/checkpoints").status_code == 200


BIG = "flight HAT001 departs 06:00, economy $120; " * 40  # about 440 tokens


def searches(client: TestClient, headers: dict[str, str], turns: int) -> list[dict[str, Any]]:
    """A session of `turns` searches, each answered with a large tool output."""
    history: list[dict[str, Any]] = [SYSTEM]
    search_call = {"id": "x", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    for turn in range(turns):
        history += [
            user(f"Search day {turn}"),
            {"role": "assistant", "tool_calls": [search_call]},
            {"role": "tool", "tool_call_id": "x", "content": BIG},
        ]
        response = chat(client, history, headers)
        assert response.status_code == 200
        history.append(response.json()["choices"][0]["message"])
    return history


def test_trimming_sends_the_engine_a_compacted_context_and_keeps_artifacts(
    gateway: Gateway, redis_url: str
) -> None:
    policy = parse_policy(
        POLICY
        + f"state: {{redis_url: '{redis_url}'}}\n"
        + "trimming: {enabled: true, high_water_tokens: 300, low_water_tokens: 100}\n"
    )
    client, fake = gateway(policy_override=policy)
    headers = session_headers()
    sid = headers["X-Session-Id"]
    history = searches(client, headers, 3)
    sent = orjson.loads(fake.calls[-1].body)["messages"]
    assert len(orjson.dumps(sent)) < len(orjson.dumps(history))
    assert "Earlier turns, compacted" in orjson.dumps(sent).decode()
    checkpoint = client.get(f"/v1/sessions/{sid}/checkpoints/3").json()
    assert checkpoint["engine_request"]["messages"] == [normalise(m) for m in sent]
    artifact = client.get(f"/v1/sessions/{sid}/artifacts/m3").json()
    assert artifact["content"] == BIG
    assert artifact["tool"] == "search"
    missing = client.get(f"/v1/sessions/{sid}/artifacts/m1")
    assert missing.status_code == 404
    metrics = client.get("/metrics").text
    assert 'gateway_trims_total{outcome="trimmed"} 3.0' in metrics


@pytest.mark.parametrize("told", [True, False])
def test_a_trimming_budget_keeps_a_session_inside_the_engines_context(
    gateway: Gateway, redis_url: str, told: bool
) -> None:
    """Watermarks far above what the engine holds (a policy written for a large model in
    front of a small one): the budget's context cap still keeps every request inside,
    whether the policy says the engine's window or the engine does (its `/v1/models`, as
    the health monitor reads it)."""
    context = "context_tokens: 2048, " if told else ""
    policy = parse_policy(
        POLICY
        + f"state: {{redis_url: '{redis_url}'}}\n"
        + "trimming: {enabled: true, high_water_tokens: 100000, low_water_tokens: 50000,"
        + f" budget: {{{context}context_share: 0.5}}}}\n"
    )
    client, fake = gateway(policy_override=policy)
    if not told:
        current(client.app.state).fleet.pools["chat"].replicas[0].context_tokens = 2048  # type: ignore[attr-defined]
    history = searches(client, session_headers(), 6)
    counter = token_counter(None)
    untrimmed = sum(counter.count(message_text(m)) + 4 for m in history[1:])
    assert untrimmed > 1024  # the whole history would outgrow the engine's share
    for call in fake.calls:
        sent = orjson.loads(call.body)["messages"]
        assert sum(counter.count(message_text(m)) + 4 for m in sent[1:]) <= 1024
    capped = [line for line in client.get("/metrics").text.splitlines()
              if line.startswith("gateway_trim_capped_total ")]  # fmt: skip
    assert capped and float(capped[0].split()[1]) >= 1  # the cap, not the watermarks, trimmed


def test_each_checkpoint_materialises_the_declared_entities(
    gateway: Gateway, redis_url: str
) -> None:
    policy = parse_policy(
        POLICY
        + f"state: {{redis_url: '{redis_url}'}}\n"
        + "trimming:\n  enabled: true\n  state_tools:\n"
        + "    get_res: {entity: reservation, id_field: reservation_id}\n"
    )
    client, _ = gateway(policy_override=policy)
    headers = session_headers()
    sid = headers["X-Session-Id"]
    lookup = {"id": "c", "type": "function", "function": {"name": "get_res", "arguments": "{}"}}

    def snapshot(cabin: str) -> list[dict[str, Any]]:
        content = orjson.dumps({"reservation_id": "R1", "cabin": cabin}).decode()
        return [
            {"role": "assistant", "tool_calls": [lookup]},
            {"role": "tool", "tool_call_id": "c", "content": content},
        ]

    history: list[dict[str, Any]] = [user("show R1"), *snapshot("business")]
    history.append(chat(client, history, headers).json()["choices"][0]["message"])
    history += [user("downgrade it"), *snapshot("economy")]
    chat(client, history, headers)
    first = client.get(f"/v1/sessions/{sid}/checkpoints/1").json()
    second = client.get(f"/v1/sessions/{sid}/checkpoints/2").json()
    assert first["entities"] == {"reservation:R1": {"reservation_id": "R1", "cabin": "business"}}
    assert second["entities"] == {"reservation:R1": {"reservation_id": "R1", "cabin": "economy"}}
