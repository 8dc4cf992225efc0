"""Sessions against real vLLM: delta hydration with the openai SDK, a LangGraph agent
checkpointed turn by turn, and a gateway restarted mid-session resuming from Redis."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph

from tests.integration.conftest import Gateway, running_gateway

pytestmark = pytest.mark.engine

# Longer than one 32-token KV block, so a turn on the session's replica reuses it.
SYSTEM = "You are the airline's booking assistant. " * 12


def sdk(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key="unused", max_retries=0, timeout=120)


def checkpoints(gateway: Gateway, session: str) -> list[dict[str, Any]]:
    listing = httpx.get(f"{gateway.v1}/sessions/{session}/checkpoints", timeout=30)
    assert listing.status_code == 200, listing.text
    data: list[dict[str, Any]] = listing.json()["data"]
    return data


def checkpoint(gateway: Gateway, session: str, turn: int) -> dict[str, Any]:
    response = httpx.get(f"{gateway.v1}/sessions/{session}/checkpoints/{turn}", timeout=30)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_delta_mode_turns_with_the_openai_sdk(gateway: Gateway) -> None:
    client = sdk(gateway)
    session = f"it-{uuid.uuid4().hex}"
    first = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        extra_headers={"X-Session-Id": session},
    )
    assert first.headers["x-gateway-session-turn"] == "1"
    reply = first.parse().choices[0].message
    second = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Change my flight"}],
        max_tokens=4,
        temperature=0,
        extra_headers={"X-Session-Id": session, "X-Context-Mode": "delta"},
    )
    first_usage = first.parse().usage
    assert second.usage is not None and first_usage is not None
    assert second.usage.prompt_tokens > first_usage.prompt_tokens
    details = second.usage.prompt_tokens_details
    assert details is not None and (details.cached_tokens or 0) > 0  # same replica, cache hit
    sent = checkpoint(gateway, session, 2)["engine_request"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[2]["content"] == (reply.content or "")


def test_a_langgraph_agent_is_checkpointed_turn_by_turn(gateway: Gateway) -> None:
    session = f"lg-{uuid.uuid4().hex}"
    with httpx.Client(timeout=120) as http:
        model = ChatOpenAI(
            base_url=gateway.v1,
            api_key="unused",
            model="tiny",
            max_tokens=4,
            temperature=0,
            max_retries=0,
            http_client=http,
            default_headers={"X-Session-Id": session},
        )

        def agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [model.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_edge(START, "agent")
        app = graph.compile()
        state = app.invoke({"messages": [SystemMessage(SYSTEM), HumanMessage("Hi")]})
        app.invoke({"messages": [*state["messages"], HumanMessage("Cancel it")]})
    turns = checkpoints(gateway, session)
    # LangGraph resends the whole history; the gateway keeps only what each turn added.
    assert [(t["new_messages"], t["rewrite"]) for t in turns] == [(2, False), (1, False)]


def test_a_restarted_gateway_resumes_the_session_from_redis(
    gateway: Gateway, tmp_path_factory: pytest.TempPathFactory
) -> None:
    log = tmp_path_factory.mktemp("restart") / "gateway.log"
    session = f"rs-{uuid.uuid4().hex}"
    headers = {"X-Session-Id": session}
    with running_gateway(gateway.policy, log) as first:
        sdk(first).chat.completions.create(
            model="tiny",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
            max_tokens=4,
            extra_headers=headers,
        )
    with running_gateway(gateway.policy, log) as second:  # a new process, nothing in memory
        sdk(second).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "And now?"}],
            max_tokens=4,
            extra_headers={**headers, "X-Context-Mode": "delta"},
        )
        sent = checkpoint(second, session, 2)["engine_request"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[0]["content"] == SYSTEM


def test_two_gateway_processes_share_sessions_and_responses(
    gateway: Gateway, tmp_path_factory: pytest.TempPathFactory
) -> None:
    log = tmp_path_factory.mktemp("second") / "gateway.log"
    session = f"two-{uuid.uuid4().hex}"
    with running_gateway(gateway.policy, log) as other:
        # A chat session: turn 1 on one process, turn 2 (delta) on the other.
        sdk(gateway).chat.completions.create(
            model="tiny",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
            max_tokens=4,
            extra_headers={"X-Session-Id": session},
        )
        sdk(other).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Next"}],
            max_tokens=4,
            extra_headers={"X-Session-Id": session, "X-Context-Mode": "delta"},
        )
        assert len(checkpoints(gateway, session)) == 2
        # A Responses conversation: continued on the other process at once.
        first = sdk(gateway).responses.create(model="tiny", input="Hello", max_output_tokens=4)
        second = sdk(other).responses.create(
            model="tiny", input="Again", max_output_tokens=4, previous_response_id=first.id
        )
        sent = checkpoint(other, first.id, 2)["engine_request"]["messages"]
    assert [m["role"] for m in checkpoint(gateway, session, 2)["engine_request"]["messages"]] == [
        "system", "user", "assistant", "user"]  # fmt: skip
    assert [m["content"] for m in sent if m["role"] == "user"] == ["Hello", "Again"]
    assert second.previous_response_id == first.id


def test_a_streamed_session_turn_is_checkpointed_with_usage_the_client_did_not_ask_for(
    gateway: Gateway,
) -> None:
    session = f"st-{uuid.uuid4().hex}"
    stream = sdk(gateway).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        stream=True,
        extra_headers={"X-Session-Id": session},
    )
    chunks = list(stream)
    assert chunks and all(c.usage is None and c.choices for c in chunks)
    turn = checkpoints(gateway, session)[0]
    assert turn["usage"]["prompt_tokens"] > 0
