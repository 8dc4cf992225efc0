"""The session store stopped and restarted under load, with a private, durable
redis-server (append-only file) so the shared Redis of the other tests is left alone.

Fail open (the default): every turn is answered while Redis is down, marked
`X-Gateway-Degraded: checkpoint`; once Redis is back the gateway reconnects by itself and
the next turns are kept again; no session has a half-written or missing checkpoint (the
turns reported kept are stored, in order; see `assert_consistent`). Fail closed: turns are refused
with an OpenAI-shaped 503 while Redis is down, and served again after.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from engine.supervisor import free_port
from gateway.state.store import redis_server_binary
from tests.fault.conftest import Upstreams
from tests.fault.harness import gateway_policy
from tests.integration.conftest import Gateway, running_gateway
from tests.lifetimes import suite_reaper


class PrivateRedis:
    """A redis-server of this test's own, stopped and started again on the same port."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = redis_server_binary()
        assert binary, "no redis-server"
        self._process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
             str(self.directory), "--appendonly", "yes", "--save", ""],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # held by the suite's reaper: gone with pytest
        )  # fmt: skip
        suite_reaper().hold(self._process.pid)
        deadline = time.monotonic() + 10
        with redis.Redis(port=self.port) as client:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "redis-server did not start"
                    time.sleep(0.05)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()  # a clean shutdown: the AOF is flushed
            self._process.wait(timeout=10)
            suite_reaper().release(self._process.pid)
            self._process = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Session:
    id: str = field(default_factory=lambda: f"outage-{uuid.uuid4().hex}")
    history: list[dict[str, str]] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)  # turn numbers the gateway reported
    degraded: int = 0
    refused: int = 0


def turn(client: httpx.Client, gateway: Gateway, session: Session) -> None:
    messages = [*session.history, {"role": "user", "content": f"turn {len(session.kept)}"}]
    response = client.post(
        f"{gateway.v1}/chat/completions",
        json={"model": "main", "messages": messages},
        headers={"X-Session-Id": session.id},
    )
    if response.status_code == 503:
        error = response.json()["error"]  # OpenAI-shaped, never a bare 500
        assert error["code"] == "state_store_unavailable", error
        session.refused += 1
        return
    assert response.status_code == 200, response.text
    reply = response.json()["choices"][0]["message"]
    session.history = [*messages, {"role": "assistant", "content": reply["content"]}]
    kept = response.headers["x-gateway-session-turn"]
    if kept == "unsaved":
        assert response.headers["x-gateway-degraded"] == "checkpoint"
        session.degraded += 1
    else:
        session.kept.append(int(kept))


def run_under_outage(gateway: Gateway, store: PrivateRedis, seconds: float = 6.0) -> list[Session]:
    """8 sessions taking turns; Redis down from 1/3 to 2/3 of the run."""
    sessions = [Session() for _ in range(8)]
    stop = threading.Event()

    def work(session: Session) -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                turn(client, gateway, session)

    with ThreadPoolExecutor(len(sessions)) as pool:
        running = [pool.submit(work, s) for s in sessions]
        time.sleep(seconds / 3)
        store.stop()
        time.sleep(seconds / 3)
        store.start()
        time.sleep(seconds / 3)
        stop.set()
        for future in running:
            future.result()
    return sessions


def stored(gateway: Gateway, session: Session) -> int:
    listing = httpx.get(f"{gateway.v1}/sessions/{session.id}/checkpoints", timeout=10)
    assert listing.status_code == 200, listing.text
    return len(listing.json()["data"])


def assert_consistent(gateway: Gateway, session: Session) -> None:
    """Every turn reported kept is stored, in order, and nothing else but whole turns is.

    A turn reported unsaved may still be stored: a write Redis applied just before it went
    down, its reply lost with the connection. It is whole (one MULTI/EXEC), so the next
    turn simply counts on from it; a gap in the reported numbers is never a lost turn.
    """
    count = stored(gateway, session)
    assert session.kept == sorted(set(session.kept)), session.kept
    if session.kept:
        assert session.kept[-1] == count  # the last kept turn is the last stored
    assert count <= len(session.kept) + session.degraded + session.refused
    missing = set(range(1, count + 1)) - set(session.kept)
    assert len(missing) <= session.degraded + session.refused


@contextmanager
def open_gateway(
    upstreams: Upstreams, store: PrivateRedis, tmp_path: Path, outage: str
) -> Iterator[Gateway]:
    policy = tmp_path / "policy.yaml"
    text = gateway_policy(list(upstreams.main), upstreams.spare, store.url)
    policy.write_text(text + f"sessions: {{on_store_outage: {outage}}}\n")
    with running_gateway(policy, tmp_path / "gateway.log") as gateway:
        yield gateway


def test_fail_open_serves_through_the_outage_and_keeps_every_reported_turn(
    fault_upstreams: Upstreams, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    with open_gateway(fault_upstreams, private_redis, tmp_path, "fail_open") as gateway:
        sessions = run_under_outage(gateway, private_redis)
        assert sum(s.degraded for s in sessions) > 0, "the outage was never felt"
        assert sum(s.refused for s in sessions) == 0
        for session in sessions:
            assert_consistent(gateway, session)
        # Redis came back and the gateway reconnected by itself: turns are kept again.
        with httpx.Client(timeout=30) as client:
            turn(client, gateway, sessions[0])
        assert_consistent(gateway, sessions[0])


def test_fail_closed_refuses_while_the_store_is_down(
    fault_upstreams: Upstreams, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    with open_gateway(fault_upstreams, private_redis, tmp_path, "fail_closed") as gateway:
        sessions = run_under_outage(gateway, private_redis)
        assert sum(s.refused for s in sessions) > 0
        assert sum(s.degraded for s in sessions) == 0
        for session in sessions:
            assert_consistent(gateway, session)
