"""LangChain's ChatOpenAI pointed at the gateway, as an agent framework would use it."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.integration.conftest import Gateway

pytestmark = pytest.mark.engine


@tool
def lookup_booking(booking_id: str) -> str:
    """Look up a booking by its id."""
    return f"booking {booking_id}: confirmed"


@pytest.fixture
def llm(gateway: Gateway) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=gateway.v1,
        api_key="unused",
        model="tiny",
        max_tokens=8,
        max_retries=0,
        timeout=120,
    )


def test_invoke(llm: ChatOpenAI) -> None:
    reply = llm.invoke([SystemMessage("You are terse."), HumanMessage("Hello")])
    assert isinstance(reply, AIMessage)
    assert reply.usage_metadata is not None
    assert reply.usage_metadata["output_tokens"] > 0


def test_stream(llm: ChatOpenAI) -> None:
    pieces = list(llm.stream("Tell me a story"))
    assert len(pieces) >= 2
    assert "".join(str(p.content) for p in pieces)


def test_stream_with_usage(gateway: Gateway) -> None:
    llm = ChatOpenAI(
        base_url=gateway.v1, api_key="unused", model="tiny", max_tokens=6, stream_usage=True
    )
    total = None
    for piece in llm.stream("Hi"):
        total = piece if total is None else total + piece
    assert total is not None and total.usage_metadata is not None
    assert total.usage_metadata["output_tokens"] == 6


def test_bound_tools_are_sent_and_a_forced_call_comes_back(llm: ChatOpenAI) -> None:
    forced = llm.bind_tools([lookup_booking], tool_choice="lookup_booking").bind(max_tokens=60)
    reply = forced.invoke("Check booking ABC123")
    assert isinstance(reply, AIMessage)
    assert reply.tool_calls
    assert reply.tool_calls[0]["name"] == "lookup_booking"


async def test_async_invoke(llm: ChatOpenAI) -> None:
    reply = await llm.ainvoke("Hello")
    assert isinstance(reply, AIMessage)
