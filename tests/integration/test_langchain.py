"""LangChain's ChatOpenAI pointed at the gateway, as an agent framework would use it."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.integration.conftest import Gateway, refused_as_invalid

pytestmark = pytest.mark.engine


@tool
def lookup_booking(booking_id: str) -> str:
    """Look up a booking by its id."""
    return f"booking {booking_id}: confirmed"


@pytest.fixture
async def clients() -> AsyncIterator[tuple[httpx.Client, httpx.AsyncClient]]:
    """Our own HTTP clients, closed after each test (LangChain would leave its own open)."""
    with httpx.Client(timeout=120) as sync_client:
        async with httpx.AsyncClient(timeout=120) as async_client:
            yield sync_client, async_client


def chat(
    gateway: Gateway, clients: tuple[httpx.Client, httpx.AsyncClient], **options: Any
) -> ChatOpenAI:
    settings: dict[str, Any] = {"max_tokens": 8, **options}
    return ChatOpenAI(
        base_url=gateway.v1,
        api_key="unused",
        model="tiny",
        max_retries=0,
        http_client=clients[0],
        http_async_client=clients[1],
        **settings,
    )


@pytest.fixture
def llm(gateway: Gateway, clients: tuple[httpx.Client, httpx.AsyncClient]) -> ChatOpenAI:
    return chat(gateway, clients)


def test_invoke(llm: ChatOpenAI) -> None:
    reply = llm.invoke([SystemMessage("You are terse."), HumanMessage("Hello")])
    assert isinstance(reply, AIMessage)
    assert reply.usage_metadata is not None
    assert reply.usage_metadata["output_tokens"] > 0


def test_stream(gateway: Gateway, clients: tuple[httpx.Client, httpx.AsyncClient]) -> None:
    llm = chat(gateway, clients, extra_body={"ignore_eos": True})  # never an empty answer
    pieces = list(llm.stream("Tell me a story"))
    assert len(pieces) >= 2
    assert "".join(str(p.content) for p in pieces)


def test_stream_with_usage(
    gateway: Gateway, clients: tuple[httpx.Client, httpx.AsyncClient]
) -> None:
    llm = chat(gateway, clients, max_tokens=6, stream_usage=True, extra_body={"ignore_eos": True})
    total = None
    for piece in llm.stream("Hi"):
        total = piece if total is None else total + piece
    assert total is not None and total.usage_metadata is not None
    assert total.usage_metadata["output_tokens"] == 6


def test_bound_tools_reach_the_engine_and_force_the_call(llm: ChatOpenAI) -> None:
    forced = llm.bind_tools([lookup_booking], tool_choice="lookup_booking").bind(
        max_tokens=60, temperature=0
    )
    try:
        reply = forced.invoke("Check booking ABC123")
    except openai.APIStatusError as exc:
        refused_as_invalid(exc)
        return
    assert isinstance(reply, AIMessage)
    # Parsed when the random-weight model finishes the constrained JSON, markup otherwise.
    if reply.tool_calls:
        assert reply.tool_calls[0]["name"] == "lookup_booking"
    else:
        assert re.match(r'<tool_call>\s*\{"name": "lookup_booking"', str(reply.content))


async def test_async_invoke(llm: ChatOpenAI) -> None:
    reply = await llm.ainvoke("Hello")
    assert isinstance(reply, AIMessage)
