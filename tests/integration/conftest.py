"""Real engines for the integration suite: 2 `cpu-tiny` vLLM replicas and 1 embedding
replica, started once per session with `engine up`'s own code, and the gateway run as a
real server process in front of them.

Nothing here is skipped when the engine environment is missing: `make test` builds it,
and a missing engine is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from engine.cli import resolve_model
from engine.lifeline import Lifeline
from engine.profiles import load_profile
from engine.state import ReplicaRecord
from engine.supervisor import ROOT, Launch, Paths, down, free_port, up
from tests.lifetimes import suite_reaper


@dataclass(frozen=True)
class Engines:
    state_file: Path
    replicas: list[ReplicaRecord]

    def urls(self, pool: str) -> list[str]:
        return [r.url for r in self.replicas if r.pool == pool]


@dataclass(frozen=True)
class Gateway:
    base_url: str  # http://127.0.0.1:PORT
    log: Path
    policy: Path
    pid: int = 0

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"


def engine_paths(run_dir: Path) -> Paths:
    """Where engines started by a test keep their state file and logs."""
    return Paths(
        run=run_dir,
        state=run_dir / "engine-state.json",
        logs=run_dir / "logs",
        python=Path(os.environ.get("ENGINE_PYTHON", ROOT / ".venv-engine" / "bin" / "python")),
    )


@pytest.fixture(scope="session")
def engines(
    tmp_path_factory: pytest.TempPathFactory, engine_lifeline: Lifeline
) -> Iterator[Engines]:
    paths = engine_paths(tmp_path_factory.mktemp("engines"))
    if not paths.python.exists():
        pytest.fail(
            f"no engine environment at {paths.python}: run `make engine-env` (make test does)"
        )
    chat = load_profile("cpu-tiny")
    embed = load_profile("cpu-tiny-embed")
    model = resolve_model(chat, None, paths)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    records = up(
        [Launch(chat, 2, model), Launch(embed, 1, model)],
        paths=paths, say=say, timeout_s=900, lifeline=engine_lifeline,
    )  # fmt: skip
    try:
        yield Engines(paths.state, records)
    finally:
        down(paths, say=say, lifeline=engine_lifeline)


DEAD_URL = "http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def gateway(
    engines: Engines, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("gateway")
    dead = DEAD_URL.format(port=free_port())  # nothing listens there: a replica that is down
    live_chat = engines.urls("tiny-chat")[0]
    policy = work / "policy.yaml"
    policy.write_text(
        f"""\
version: 1
limits: {{max_body_bytes: 262144}}
health: {{interval_s: 1, retry_after_s: 3}}
state: {{redis_url: "{redis_url}"}}
pools:
  tiny-chat:
    served_model: tiny
    engine_state: {engines.state_file}
  tiny-embed:
    served_model: tiny-embed
    serves: [embeddings]
    engine_state: {engines.state_file}
  half-down:
    served_model: tiny
    replicas: [{{url: "{dead}"}}, {{url: "{live_chat}"}}]
  all-down:
    served_model: tiny
    replicas: [{{url: "{dead}"}}]
models:
  tiny: {{pool: tiny-chat}}
  tiny-embed: {{pool: tiny-embed}}
  tiny-half-down: {{pool: half-down}}
  tiny-all-down: {{pool: all-down}}
"""
    )
    with running_gateway(policy, work / "gateway.log") as gateway:
        yield gateway


@contextmanager
def running_gateway(policy: Path, log: Path, port: int | None = None) -> Iterator[Gateway]:
    """`gateway serve` as a real process; stopped (SIGTERM, graceful) on exit."""
    port = port or free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--policy", str(policy),
             "--port", str(port)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # held by the suite's reaper: gone with pytest
        )  # fmt: skip
    suite_reaper().hold(proc.pid)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"gateway exited:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=1):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"gateway did not start:\n{log.read_text()}")
                time.sleep(0.2)
        yield Gateway(base, log, policy, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # Still this test's failure, but not the next one's: a process left running
            # would be collected later, its ResourceWarning failing whichever test runs.
            proc.kill()
            proc.wait()
            raise
        finally:
            suite_reaper().release(proc.pid)


def refused_as_invalid(exc: openai.APIStatusError) -> None:
    """The gateway's refusal of a tool call whose arguments break the tool's schema. vLLM
    0.32 constrains only a named call's name; the tiny model's random weights make its
    arguments (`true`, `[]`, JSON cut short), which the gateway never passes on."""
    assert exc.status_code == 502 and exc.code == "invalid_tool_call", exc


def applied(gateway: Gateway) -> float:
    """The placements of other gateways this one has applied (`gateway_routing_placements_total`)."""
    text = httpx.get(f"{gateway.base_url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith('gateway_routing_placements_total{outcome="applied"}'):
            return float(line.split()[-1])
    return 0.0


def until_applied(gateway: Gateway, count: float) -> None:
    """Until the gateway has applied `count` placements of the others (10 s at most)."""
    deadline = time.monotonic() + 10
    while applied(gateway) < count:
        assert time.monotonic() < deadline, "the placement never reached the other gateway"
        time.sleep(0.01)
