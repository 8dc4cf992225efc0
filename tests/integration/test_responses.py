"""The Responses API against real vLLM: the OpenAI Agents SDK continuing a conversation
with `previous_response_id` (and the items it was made from listed by the openai SDK),
and a streamed response read by the openai SDK."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
from pydantic import BaseModel

from tests.integration.conftest import Gateway

pytestmark = pytest.mark.engine

SYSTEM = "You are the airline's booking assistant. " * 12


class Reply(BaseModel):
    done: bool


async def test_an_agents_sdk_agent_continues_from_its_previous_response(
    gateway: Gateway,
) -> None:
    set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key="unused", max_retries=0)
    agent = Agent(
        name="booking",
        instructions=SYSTEM,
        model=OpenAIResponsesModel(model="tiny", openai_client=client),
        # A structured answer (xgrammar) ends the random-weight model's output cleanly; a
        # free-text one would run into max_tokens, which the SDK treats as an error.
        output_type=Reply,
        model_settings=ModelSettings(max_tokens=32, temperature=0),
    )
    first = await Runner.run(agent, "Hi")
    second = await Runner.run(
        agent, "Change my flight", previous_response_id=first.last_response_id
    )
    assert first.last_response_id and second.last_response_id
    session = first.last_response_id  # a conversation's session is named after its first
    async with httpx.AsyncClient(timeout=30) as http:
        stored = await http.get(f"{gateway.v1}/responses/{second.last_response_id}")
        assert stored.status_code == 200
        assert stored.json()["previous_response_id"] == first.last_response_id
        turn = (await http.get(f"{gateway.v1}/sessions/{session}/checkpoints/2")).json()
    sent = turn["engine_request"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[0]["content"] == SYSTEM and sent[-1]["content"] == "Change my flight"
    # What the second was made from: the first's input and output, then its own input.
    listed = client.responses.input_items.list(second.last_response_id, order="asc")
    items = [item.model_dump() async for item in listed]
    assert [(i["type"], i["role"]) for i in items] == [
        ("message", "user"), ("message", "assistant"), ("message", "user")
    ]  # fmt: skip
    assert [items[0]["content"][0]["text"], items[-1]["content"][0]["text"]] == [
        "Hi", "Change my flight"
    ]  # fmt: skip
    await client.close()


async def test_an_agents_sdk_agent_s_context_is_compacted_server_side(gateway: Gateway) -> None:
    """The Agents SDK's `context_management` (OpenAI's server-side compaction): a history
    past the threshold reaches vLLM compacted, the response's output starts with the
    compaction item, and the next turn by `previous_response_id` goes on from the
    compacted conversation."""
    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key="unused", max_retries=0)
    settings = ModelSettings(
        max_tokens=32,
        temperature=0,
        context_management=[{"type": "compaction", "compact_threshold": 1000}],
    )
    agent = Agent(
        name="booking",
        instructions=SYSTEM,
        model=OpenAIResponsesModel(model="tiny", openai_client=client),
        output_type=Reply,
        model_settings=settings,
    )
    history: list[Any] = []
    for i in range(8):
        history += [
            {"role": "user", "content": f"Earlier question {i}: " + "my booking details " * 60},
            {"role": "assistant", "content": f"Noted, booking {i}."},
        ]
    first = await Runner.run(agent, [*history, {"role": "user", "content": "Change my flight"}])
    second = await Runner.run(agent, "And my seat", previous_response_id=first.last_response_id)
    assert second.last_response_id
    async with httpx.AsyncClient(timeout=30) as http:
        stored = (await http.get(f"{gateway.v1}/responses/{first.last_response_id}")).json()
        assert stored["output"][0]["type"] == "compaction"
        session = first.last_response_id
        turns = [
            (await http.get(f"{gateway.v1}/sessions/{session}/checkpoints/{n}")).json()
            for n in (1, 2)
        ]
    for turn in turns:  # both turns sent the compacted conversation, not the history
        texts = [text_of(m.get("content")) for m in turn["engine_request"]["messages"]]
        assert any(t.startswith("[Earlier turns, compacted") for t in texts)
        assert not any(t.startswith("Earlier question 0") for t in texts)
    await client.close()


def text_of(content: Any) -> str:
    """A chat message's text, whether its content is a string or a list of parts."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content)
    return str(content)


@pytest.fixture
def client(gateway: Gateway) -> Iterator[openai.OpenAI]:
    """The openai SDK's client, closed with the test (its pooled sockets are not left to
    the collector, whose warning would fail a later test)."""
    with openai.OpenAI(base_url=gateway.v1, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def test_a_streamed_response_with_the_openai_sdk(client: openai.OpenAI) -> None:
    events = list(
        # temperature 0: the random weights ending the answer within four tokens would
        # complete it instead (about 1 in 1,000 at the default temperature)
        client.responses.create(
            model="tiny", input="Hello", max_output_tokens=4, temperature=0, stream=True
        )
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created"
    assert "response.output_text.delta" in kinds
    # Four tokens from a random-weight model: cut by max_output_tokens, as OpenAI tells it.
    terminal = events[-1]
    assert terminal.type == "response.incomplete"
    final = terminal.response
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.usage is not None and final.usage.input_tokens > 0
    again = client.responses.retrieve(final.id)
    assert again.id == final.id


# A coding agent's instructions run to kilobytes (Codex's about 20 KB): most of what a
# compacted conversation shares with the turns before it.
INSTRUCTIONS = SYSTEM * 40


def test_a_compacted_conversation_continues_from_the_engine_s_prefix_cache(
    client: openai.OpenAI,
) -> None:
    """Codex's remote compaction with the openai SDK: `POST /v1/responses/compact` folds
    the early turns (the gateway's trimming; no engine asked), the compaction item goes
    into the next turn, which reads the prefix the turns before it cached, and the turn
    after reads the compacted block itself from the cache."""
    key = str(uuid.uuid4())  # Codex's session: every turn to one replica
    turns: list[Any] = []
    for i in range(10):
        turns += [
            {"role": "user", "content": f"step {i}: show order {i}"},
            {"type": "function_call", "call_id": f"c{i}", "name": "show",
             "arguments": f'{{"order": {i}}}'},
            {"type": "function_call_output", "call_id": f"c{i}",
             "output": f"order {i}: " + "item shipped on time; " * 60},
            {"role": "assistant", "content": f"Order {i} shipped."},
        ]  # fmt: skip

    def turn(items: list[Any]) -> Any:
        raw = client.responses.with_raw_response.create(
            model="tiny", instructions=INSTRUCTIONS, input=items, store=False,
            prompt_cache_key=key, max_output_tokens=4,
        )  # fmt: skip
        routes.append(raw.headers.get("x-gateway-route"))
        return raw.parse()

    routes: list[str | None] = []

    turn([*turns, {"role": "user", "content": "and order 10?"}])  # the conversation so far
    compacted = client.responses.with_raw_response.compact(
        model="tiny", instructions=INSTRUCTIONS, input=turns
    )
    items = compacted.http_response.json()["output"]
    assert items[-1]["type"] == "compaction"
    assert compacted.parse().usage.output_tokens < compacted.parse().usage.input_tokens
    after = turn([*items, {"role": "user", "content": "and order 11?"}])
    assert after.usage is not None
    assert after.usage.input_tokens_details.cached_tokens > 0, routes
    again = turn([*items, {"role": "user", "content": "and order 12?"}])
    assert again.usage is not None
    assert again.usage.input_tokens_details.cached_tokens > again.usage.input_tokens // 2, routes
    assert again.usage.input_tokens < before_tokens(client, turns)


def before_tokens(client: openai.OpenAI, turns: list[Any]) -> int:
    """The uncompacted conversation's prompt, as the engine counts it."""
    counted = client.responses.input_tokens.count(
        model="tiny", instructions=INSTRUCTIONS, input=[*turns, {"role": "user", "content": "?"}]
    )
    return counted.input_tokens
