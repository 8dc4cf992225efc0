"""The overhead benchmark's own HTTP/1.1 client and mock engine agree with each other.

Both speak HTTP themselves (tests/bench/overhead/loadgen.py, mock_upstream.py) so that they
take as little as they can of the cores the targets share; a framing mistake in either
would show up as errors or as speed long after the change. Here the load generator drives
the mock in one event loop: whole answers, streams (chunked, with the usage chunk), a wrong
model's 404, a connection the server closes after each answer, and answers paced by a
service time.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from tests.bench.overhead import loadgen
from tests.bench.overhead.mock_upstream import Connection, MockEngine

MODEL = "bench-model"


@pytest.fixture
async def mock_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    engine = MockEngine(MODEL, service_ms=getattr(request, "param", 0.0))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(engine), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        server.close()
        await server.wait_closed()


def _args(url: str, *, stream: bool, requests: int = 30) -> argparse.Namespace:
    return argparse.Namespace(
        url=url, concurrency=4, requests=requests, warmup=4, stream=stream, timeout_s=10.0
    )


def _body(model: str, stream: bool) -> bytes:
    request: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        request |= {"stream": True, "stream_options": {"include_usage": True}}
    return orjson.dumps(request)


HEADERS = {"Content-Type": "application/json"}


async def test_whole_answers_are_all_counted(mock_url: str) -> None:
    result = await loadgen.run(_args(mock_url, stream=False), _body(MODEL, False), HEADERS)
    assert (result["completed"], result["errors"]) == (30, 0)
    assert result["latency_ms"]["p50"] > 0


async def test_streams_are_parsed_event_by_event(mock_url: str) -> None:
    result = await loadgen.run(_args(mock_url, stream=True), _body(MODEL, True), HEADERS)
    assert (result["completed"], result["errors"]) == (30, 0)
    assert result["ttfc_ms"] is not None and result["gap_us"] is not None


async def test_a_wrong_model_is_an_error_with_its_answer(mock_url: str) -> None:
    result = await loadgen.run(_args(mock_url, stream=False), _body("other", False), HEADERS)
    assert (result["completed"], result["errors"]) == (0, 30)
    assert result["error_sample"].startswith("HTTP 404")
    assert "does not exist" in result["error_sample"]


async def test_connections_closed_by_the_server_are_replaced(mock_url: str) -> None:
    closing = {**HEADERS, "Connection": "close"}
    result = await loadgen.run(_args(mock_url, stream=False), _body(MODEL, False), closing)
    assert (result["completed"], result["errors"]) == (30, 0)


@pytest.mark.parametrize("mock_url", [20.0], indirect=True)
async def test_a_service_time_paces_whole_answers_and_streams(mock_url: str) -> None:
    whole = await loadgen.run(
        _args(mock_url, stream=False, requests=8), _body(MODEL, False), HEADERS
    )
    streamed = await loadgen.run(
        _args(mock_url, stream=True, requests=8), _body(MODEL, True), HEADERS
    )
    assert (whole["errors"], streamed["errors"]) == (0, 0)
    assert whole["latency_ms"]["p50"] >= 20  # slept before the body
    assert streamed["ttfc_ms"]["p50"] < 20 <= streamed["latency_ms"]["p50"]  # spread over it
