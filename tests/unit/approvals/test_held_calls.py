"""Held tool calls through the whole gateway (real app, real Redis, the engine's twin): a
guarded call is held, decided over the API, and released on the conversation's next
request without the engine, once; a denial and a pending approval are told instead;
streamed and not, with a session and without."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import orjson
import pytest
import redis

from gateway.telemetry import names
from tests.unit.approvals.conftest import (
    CANCEL,
    LOOKUP,
    TOOLS,
    OpenHeld,
    engine,
    sse_chunks,
    user,
)

ASK = [user("Cancel my reservation ZFA04Y, please.")]


def message_of(answer: Any) -> dict[str, Any]:
    choice = answer.json()["choices"][0]
    message: dict[str, Any] = choice["message"]
    message["finish_reason"] = choice["finish_reason"]
    return message


def test_a_guarded_call_is_held_and_the_agent_told_so(held_gateway: OpenHeld) -> None:
    gw = held_gateway()
    answer = gw.chat(ASK)
    assert answer.status_code == 200, answer.text
    approval = answer.headers["x-gateway-approval-pending"]
    message = message_of(answer)
    assert message["finish_reason"] == "stop"
    assert not message.get("tool_calls")
    assert "`cancel_reservation`" in message["content"]
    assert 'reservation_id: "ZFA04Y"' in message["content"]
    assert approval in message["content"] and approval.startswith("apr_")
    assert answer.json()["usage"]["completion_tokens"] == 5  # the engine's tokens were spent

    stored = gw.get(f"/v1/approvals/{approval}").json()
    assert stored["status"] == "pending"
    assert stored["tools"] == ["cancel_reservation"]
    assert stored["tool_calls"] == [
        {
            "id": "chatcmpl-tool-0",
            "type": "function",
            "function": {"name": "cancel_reservation", "arguments": '{"reservation_id": "ZFA04Y"}'},
        }
    ]
    assert stored["model"] == "tiny" and stored["decided_by"] is None
    listed = gw.get("/v1/approvals", status="pending").json()["data"]
    assert [a["id"] for a in listed] == [approval]
    assert gw.get("/v1/approvals", status="approved").json()["data"] == []


def test_an_approved_call_is_released_once_without_the_engine(held_gateway: OpenHeld) -> None:
    gw = held_gateway()
    session = f"s-{uuid.uuid4().hex}"
    first = gw.chat(ASK, session=session)
    approval = first.headers["x-gateway-approval-pending"]
    decided = gw.decide(approval, "approve", reason="customer confirmed by phone")
    assert decided.status_code == 200, decided.text
    body = decided.json()
    assert body["status"] == "approved" and body["reason"] == "customer confirmed by phone"
    assert body["decided_by"] and body["decided_at"] >= body["created_at"]

    engine_calls = len(gw.fake.calls)
    history = [*ASK, first.json()["choices"][0]["message"], user("Any news?")]
    released = gw.chat(history, session=session)
    assert released.status_code == 200, released.text
    assert len(gw.fake.calls) == engine_calls  # answered by the gateway alone
    assert released.headers["x-gateway-approval-released"] == approval
    assert "x-gateway-replica" not in released.headers
    message = message_of(released)
    assert message["finish_reason"] == "tool_calls"
    assert [c["function"] for c in message["tool_calls"]] == [
        {"name": "cancel_reservation", "arguments": '{"reservation_id": "ZFA04Y"}'}
    ]
    call_id = message["tool_calls"][0]["id"]
    assert gw.get(f"/v1/approvals/{approval}").json()["status"] == "released"

    # The agent runs the tool and goes on: the engine answers as ever.
    tool_turn = [
        *history,
        {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": call_id, "content": '{"status": "cancelled"}'},
    ]
    after = gw.chat(tool_turn, session=session)
    assert message_of(after)["content"] == "Done."
    assert len(gw.fake.calls) == engine_calls + 1

    # Released once: the same turn sent again is the engine's (and is held anew).
    again = gw.chat(history, session=session)
    assert again.headers["x-gateway-approval-pending"] != approval
    assert len(gw.fake.calls) == engine_calls + 2

    turns = gw.get(f"/v1/sessions/{session}/checkpoints").json()["data"]
    assert [t["route"].get("event") for t in turns[:3]] == [None, "released", None]


def test_a_denied_call_is_answered_with_the_reason_then_the_engine_resumes(
    held_gateway: OpenHeld,
) -> None:
    gw = held_gateway()
    first = gw.chat(ASK)
    approval = first.headers["x-gateway-approval-pending"]
    assert gw.decide(approval, "deny", reason="fare is not refundable").status_code == 200
    history = [*ASK, first.json()["choices"][0]["message"], user("Well?")]
    engine_calls = len(gw.fake.calls)

    denied = gw.chat(history)  # no session: found through the hold message
    assert denied.headers["x-gateway-approval-denied"] == approval
    message = message_of(denied)
    assert message["finish_reason"] == "stop" and not message.get("tool_calls")
    assert "denied" in message["content"] and "fare is not refundable" in message["content"]
    assert len(gw.fake.calls) == engine_calls

    then = gw.chat([*history, denied.json()["choices"][0]["message"], user("Ok, look it up")])
    assert "x-gateway-approval-denied" not in then.headers
    assert len(gw.fake.calls) == engine_calls + 1  # the engine's turn again (held anew)
    history_events = [e["event"] for e in gw.get(f"/v1/approvals/{approval}").json()["history"]]
    assert history_events == ["held", "denied", "denial_returned"]


def test_a_pending_call_is_told_again_without_the_engine(held_gateway: OpenHeld) -> None:
    gw = held_gateway()
    session = f"s-{uuid.uuid4().hex}"
    first = gw.chat(ASK, session=session)
    approval = first.headers["x-gateway-approval-pending"]
    engine_calls = len(gw.fake.calls)
    # Delta mode: only the new message; the session finds the approval.
    again = gw.client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [user("Done yet?")], "tools": [TOOLS["cancel_reservation"]]},
        headers={**gw.keys.bearer(gw.keys.agent), "X-Session-Id": session, "X-Context-Mode": "delta"},
    )  # fmt: skip
    assert again.headers["x-gateway-approval-pending"] == approval
    assert "still waiting" in message_of(again)["content"]
    assert len(gw.fake.calls) == engine_calls
    assert gw.get(f"/v1/approvals/{approval}").json()["status"] == "pending"


def test_streamed_hold_and_release(held_gateway: OpenHeld) -> None:
    gw = held_gateway()
    session = f"s-{uuid.uuid4().hex}"
    first = gw.chat(ASK, session=session, stream=True)
    assert first.headers["content-type"].startswith("text/event-stream")
    approval = first.headers["x-gateway-approval-pending"]
    held = sse_chunks(first.text)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in held if c["choices"])
    assert approval in text
    assert [c["choices"][0]["finish_reason"] for c in held][-1] == "stop"
    assert not any(c["choices"][0]["delta"].get("tool_calls") for c in held)
    assert not any(c.get("usage") for c in held)  # the client did not ask for it
    assert first.text.rstrip().endswith("data: [DONE]")

    gw.decide(approval, "approve")
    history = [*ASK, {"role": "assistant", "content": text}, user("Go on")]
    released = gw.chat(
        history, session=session, stream=True, stream_options={"include_usage": True}
    )
    assert released.headers["x-gateway-approval-released"] == approval
    events = sse_chunks(released.text)
    calls = [
        c for e in events if e["choices"] for c in e["choices"][0]["delta"].get("tool_calls") or ()
    ]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "cancel_reservation")]
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert events[-1]["choices"] == [] and "usage" in events[-1]


def test_a_turn_mixing_calls_is_held_whole_and_says_so(held_gateway: OpenHeld) -> None:
    gw = held_gateway(engine(LOOKUP, CANCEL))
    answer = gw.chat(ASK)
    approval = answer.headers["x-gateway-approval-pending"]
    assert "`get_reservation_details`" in message_of(answer)["content"]
    stored = gw.get(f"/v1/approvals/{approval}").json()
    assert stored["tools"] == ["cancel_reservation"]
    assert [c["function"]["name"] for c in stored["tool_calls"]] == [
        "get_reservation_details",
        "cancel_reservation",
    ]
    gw.decide(approval, "approve")
    released = gw.chat([*ASK, answer.json()["choices"][0]["message"], user("ok")])
    assert len(message_of(released)["tool_calls"]) == 2  # the whole turn, as the engine made it


def test_calls_of_unguarded_tools_pass_through(held_gateway: OpenHeld) -> None:
    gw = held_gateway(engine(LOOKUP))
    answer = gw.chat(ASK)
    assert "x-gateway-approval-pending" not in answer.headers
    assert message_of(answer)["tool_calls"][0]["function"]["name"] == "get_reservation_details"
    # Tools declared without any guarded one: the request is not even read whole.
    streamed = gw.chat(ASK, tools=[TOOLS["get_reservation_details"]], stream=True)
    assert "x-gateway-approval-pending" not in streamed.headers


def test_approvals_are_off_without_tools_named(held_gateway: OpenHeld) -> None:
    gw = held_gateway(approvals="{ttl_s: 60}")
    answer = gw.chat(ASK)
    assert message_of(answer)["tool_calls"][0]["function"]["name"] == "cancel_reservation"


def test_per_model_and_per_tenant_tools(held_gateway: OpenHeld) -> None:
    gw = held_gateway(engine(LOOKUP), approvals="{models: {tiny: [get_reservation_details]}}")
    assert "x-gateway-approval-pending" in gw.chat(ASK).headers


def test_several_choices_are_refused_for_guarded_requests(held_gateway: OpenHeld) -> None:
    gw = held_gateway()
    answer = gw.chat(ASK, n=2)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "approval_needs_one_choice"


def test_every_step_is_audited_traced_and_counted(
    held_gateway: OpenHeld, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.audit")
    gw = held_gateway()
    first = gw.chat(ASK)
    approval = first.headers["x-gateway-approval-pending"]
    trace_id = first.headers["x-gateway-trace-id"]
    traceparent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    gw.client.post(
        f"/v1/approvals/{approval}",
        json={"decision": "approve"},
        headers={**gw.keys.bearer(gw.keys.reviewer), "traceparent": traceparent},
    )
    released = gw.chat([*ASK, first.json()["choices"][0]["message"], user("ok")])
    assert "x-gateway-approval-released" in released.headers

    store = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        entries: Any = store.xrange(f"agw:approvals:{{{gw.acme}}}:audit")
    finally:
        store.close()
    events = [fields for _, fields in entries]
    assert [e["event"] for e in events] == ["held", "approved", "released"]
    assert events[0]["trace_id"] == trace_id and "ZFA04Y" in events[0]["tool_calls"]
    assert events[1]["by"] and events[1]["trace_id"] == "ab" * 16
    assert events[1]["held_trace_id"] == trace_id

    lines = [r for r in caplog.records if r.name == "gateway.audit"]
    assert [orjson.loads(r.getMessage().split(" ", 1)[1])["event"] for r in lines] == [
        "held",
        "approved",
        "released",
    ]
    assert all("ZFA04Y" not in r.getMessage() for r in lines)  # arguments stay out of logs

    stages = [s for s in gw.spans.get_finished_spans() if s.name == "approval"]
    assert [(s.attributes or {})[names.APPROVAL_EVENT] for s in stages] == ["held", "released"]
    assert {(s.attributes or {})[names.APPROVAL_ID] for s in stages} == {approval}
    assert f"{stages[0].context.trace_id:032x}" == trace_id

    metrics = gw.client.get("/metrics").text
    for event in ("held", "approved", "released"):
        assert f'gateway_approvals_total{{event="{event}",tenant="{gw.acme}"}} 1.0' in metrics


def test_the_responses_api_holds_and_releases_through_its_session(held_gateway: OpenHeld) -> None:
    gw = held_gateway()
    function = TOOLS["cancel_reservation"]["function"]
    tool = {"type": "function", **function}
    headers = gw.keys.bearer(gw.keys.agent)
    request = {"model": "tiny", "input": ASK[0]["content"], "tools": [tool]}
    first = gw.client.post("/v1/responses", json=request, headers=headers)
    assert first.status_code == 200, first.text
    approval = first.headers["x-gateway-approval-pending"]
    [said] = first.json()["output"]
    assert said["type"] == "message" and approval in said["content"][0]["text"]

    gw.decide(approval, "approve")
    follow = {**request, "input": "ok", "previous_response_id": first.json()["id"]}
    second = gw.client.post("/v1/responses", json=follow, headers=headers)
    assert second.headers["x-gateway-approval-released"] == approval
    [call] = second.json()["output"]
    assert call["type"] == "function_call" and call["name"] == "cancel_reservation"


def test_an_approval_nobody_decided_in_time_expires(held_gateway: OpenHeld, redis_url: str) -> None:
    gw = held_gateway()
    first = gw.chat(ASK)
    approval = first.headers["x-gateway-approval-pending"]
    store = redis.Redis.from_url(redis_url)
    try:  # its time runs out (the record says so; Redis keeps it for `keep_s` more)
        key = f"agw:approval:{{{gw.acme}/{approval}}}"
        held = orjson.loads(store.hget(key, "held") or b"{}")
        store.hset(key, "held", orjson.dumps({**held, "expires_at": held["created_at"]}))
    finally:
        store.close()
    assert gw.get(f"/v1/approvals/{approval}").json()["status"] == "expired"

    told = gw.chat([*ASK, first.json()["choices"][0]["message"], user("And?")])
    assert told.headers["x-gateway-approval-expired"] == approval
    assert "expired" in message_of(told)["content"]
    late = gw.decide(approval, "approve")
    assert late.status_code == 409 and late.json()["error"]["code"] == "approval_expired"
    events = [e["event"] for e in gw.get(f"/v1/approvals/{approval}").json()["history"]]
    assert events == ["held", "expired", "expiry_returned"]
