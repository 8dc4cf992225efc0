"""Human approval of destructive tool calls against real vLLM: tau-bench's airline
`cancel_reservation` called by the engine, held by a real gateway process with the openai
SDK as the agent, approved or denied over the API with an approver key, and released on
the next turn without the engine; then a LangGraph agent loop running through a hold and
a release unchanged.

The tiny model's weights are random, so it is made to call the tool: `tool_choice` stays
`auto`, as agents send it, and vLLM's structured outputs constrain the text to the Hermes
call markup, which vLLM's tool parser turns into a real `tool_calls` entry. (A named
`tool_choice` is no help here: vLLM 0.32 constrains only the call's name, and the random
model never ends its arguments.)"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
)

from tests.agent_graphs import tool_agent
from tests.conftest import SHARED_DATA
from tests.integration.conftest import Engines, Gateway, running_gateway
from tests.unit.tenant_gateway import forget_tenants, sha256

pytestmark = pytest.mark.engine

TAU_TOOLS = SHARED_DATA / "agent-trajectories" / "tau_bench_airline_tools.json"
CANCEL: ChatCompletionFunctionToolParam = next(
    t for t in json.loads(TAU_TOOLS.read_text()) if t["function"]["name"] == "cancel_reservation"
)
MAKE_THE_CALL = {
    "structured_outputs": {
        "regex": r'<tool_call>\n\{"name": "cancel_reservation", '
        r'"arguments": \{"reservation_id": "ZFA04Y"\}\}\n</tool_call>'
    }
}
REQUEST = "Please cancel my reservation ZFA04Y."
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": REQUEST}]


@dataclass(frozen=True)
class Approving:
    gateway: Gateway
    engines: list[str]  # the replicas' URLs, to count what they served
    tenant: str
    agent_key: str
    reviewer_key: str

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.gateway.v1, api_key=self.agent_key, max_retries=0, timeout=120
        )

    def decide(self, approval: str, decision: str, reason: str | None = None) -> httpx.Response:
        return httpx.post(
            f"{self.gateway.v1}/approvals/{approval}",
            json={"decision": decision, "reason": reason},
            headers={"Authorization": f"Bearer {self.reviewer_key}"},
            timeout=30,
        )

    def approval(self, approval: str) -> dict[str, Any]:
        answer = httpx.get(
            f"{self.gateway.v1}/approvals/{approval}",
            headers={"Authorization": f"Bearer {self.agent_key}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    def engine_requests(self) -> float:
        """Requests the engines finished, as their own /metrics count them."""
        total = 0.0
        for url in self.engines:
            with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
                text = response.read().decode()
            total += sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("vllm:request_success_total{")
            )
        return total


@pytest.fixture(scope="module")
def approving(
    engines: Engines, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Approving]:
    work: Path = tmp_path_factory.mktemp("approvals")
    tenant = f"airline-{uuid.uuid4().hex[:8]}"
    agent_key, reviewer_key = f"sk-agw-{uuid.uuid4().hex}", f"sk-agw-{uuid.uuid4().hex}"
    policy = work / "policy.yaml"
    policy.write_text(
        f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
pools:
  tiny-chat: {{served_model: tiny, engine_state: {engines.state_file}}}
models:
  tiny: {{pool: tiny-chat}}
tenants:
  {tenant}:
    keys:
      - {{sha256: {sha256(agent_key)}, name: agent}}
      - {{sha256: {sha256(reviewer_key)}, name: reviewer, roles: [user, approver]}}
approvals:
  tools: [cancel_reservation, book_reservation]
"""
    )
    try:
        with running_gateway(policy, work / "gateway.log") as gateway:
            yield Approving(gateway, engines.urls("tiny-chat"), tenant, agent_key, reviewer_key)
    finally:
        forget_tenants(redis_url, tenant)


def forced_cancel(
    approving: Approving,
    messages: list[ChatCompletionMessageParam],
    session: str,
    *,
    stream: bool = False,
) -> Any:
    """The engine calls `cancel_reservation` (its output constrained to the call)."""
    return approving.sdk().chat.completions.with_raw_response.create(
        model="tiny",
        messages=messages,
        tools=[CANCEL],
        max_tokens=120,
        temperature=0,
        stream=stream,
        extra_headers={"X-Session-Id": session},
        extra_body=MAKE_THE_CALL,
    )


def test_an_approved_cancellation_is_released_without_the_engine(approving: Approving) -> None:
    session = f"apr-{uuid.uuid4().hex}"
    held = forced_cancel(approving, ASK, session)
    approval = held.headers["x-gateway-approval-pending"]
    hold = held.parse().choices[0]
    assert hold.finish_reason == "stop" and not hold.message.tool_calls
    assert hold.message.content is not None and approval in hold.message.content
    stored = approving.approval(approval)
    assert stored["status"] == "pending"
    assert stored["tool_calls"][0]["function"]["name"] == "cancel_reservation"  # the engine's

    decided = approving.decide(approval, "approve", "confirmed with the customer")
    assert decided.status_code == 200, decided.text
    assert decided.json()["decided_by"]

    served = approving.engine_requests()
    assert served >= 1  # the held turn's, at least: the count is live
    history: list[ChatCompletionMessageParam] = [
        *ASK,
        {"role": "assistant", "content": hold.message.content},
        {"role": "user", "content": "Go ahead."},
    ]
    released = forced_cancel(approving, history, session)
    assert released.headers["x-gateway-approval-released"] == approval
    assert "x-gateway-replica" not in released.headers  # no engine was asked
    choice = released.parse().choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "cancel_reservation"
    assert call.function.arguments == stored["tool_calls"][0]["function"]["arguments"]
    assert approving.engine_requests() == served
    assert approving.approval(approval)["status"] == "released"


def test_a_denied_streamed_cancellation_is_answered_then_the_engine_resumes(
    approving: Approving,
) -> None:
    session = f"deny-{uuid.uuid4().hex}"
    streamed = forced_cancel(approving, ASK, session, stream=True)
    approval = streamed.headers["x-gateway-approval-pending"]
    chunks = list(streamed.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert approval in text
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)

    assert approving.decide(approval, "deny", "the fare is not refundable").status_code == 200
    again = approving.decide(approval, "approve")
    assert again.status_code == 409, again.text

    served = approving.engine_requests()
    history: list[ChatCompletionMessageParam] = [
        *ASK,
        {"role": "assistant", "content": text},
        {"role": "user", "content": "So?"},
    ]
    denied = forced_cancel(approving, history, session)
    assert denied.headers["x-gateway-approval-denied"] == approval
    message = denied.parse().choices[0].message
    assert message.content is not None and "the fare is not refundable" in message.content
    assert not message.tool_calls
    assert approving.engine_requests() == served

    # The agent goes on: the engine answers again (and its new call is held anew).
    history += [{"role": "assistant", "content": message.content}]
    history += [{"role": "user", "content": "Then look at it once more."}]
    after = forced_cancel(approving, history, session)
    assert "x-gateway-replica" in after.headers
    assert after.headers["x-gateway-approval-pending"] != approval


@tool
def cancel_reservation(reservation_id: str) -> str:
    """Cancel the whole reservation."""
    return f"reservation {reservation_id[:12]} cancelled"


def test_a_langgraph_agent_loop_runs_through_a_hold_and_a_release(approving: Approving) -> None:
    """The agent knows nothing of approvals: a hold ends its turn like any answer in words;
    after the approval its next turn gets the call, runs the tool, and carries on. No
    session header either: the gateway finds the approval in the history it resends."""
    with httpx.Client(timeout=120) as http:
        model = ChatOpenAI(
            base_url=approving.gateway.v1,
            api_key=approving.agent_key,
            model="tiny",
            max_tokens=120,
            temperature=0,
            max_retries=0,
            http_client=http,
            extra_body=MAKE_THE_CALL,
        ).bind_tools([cancel_reservation])

        app = tool_agent(model, [cancel_reservation])

        first = app.invoke({"messages": [HumanMessage(REQUEST)]})
        hold = first["messages"][-1]
        assert isinstance(hold, AIMessage) and not hold.tool_calls
        found = re.search(r"apr_[0-9a-f]{24}", str(hold.content))
        assert found is not None, hold.content
        approval = found.group(0)
        assert approving.decide(approval, "approve").status_code == 200

        second = app.invoke({"messages": [*first["messages"], HumanMessage("Approved?")]})
    added = second["messages"][len(first["messages"]) + 1 :]
    released, result = added[0], added[1]
    assert isinstance(released, AIMessage)
    assert [c["name"] for c in released.tool_calls] == ["cancel_reservation"]
    assert isinstance(result, ToolMessage) and "cancelled" in str(result.content)
    # The loop went on to the engine, whose new forced call was held in turn.
    assert isinstance(added[-1], AIMessage) and "apr_" in str(added[-1].content)
    assert approving.approval(approval)["status"] == "released"
