"""Processes of the fault suite and the fault load run: fake engines (`fault_upstream`) as
real processes, the policy of the gateway put in front of them, and reading its metrics.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.supervisor import free_port
from gateway.fleet.replicas import Replica
from tests.lifetimes import suite_reaper

ROOT = Path(__file__).resolve().parents[2]

MAIN_POOL = "main"
SPARE_POOL = "spare"


@dataclass
class FaultUpstream:
    """One `python -m tests.fault.fault_upstream` process, restartable on its port."""

    name: str
    port: int
    log: Path
    tokens: int = 5
    token_delay_s: float = 0.0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def replica_id(self, pool: str = MAIN_POOL) -> str:
        """What the gateway calls this engine in `X-Gateway-Replica` and its metrics."""
        return Replica(pool, self.url, "-").id

    def start(self, timeout_s: float = 20.0) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.fault.fault_upstream", "--port", str(self.port),
                 "--name", self.name, "--tokens", str(self.tokens),
                 "--token-delay-s", str(self.token_delay_s)],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # held by the suite's reaper: gone with pytest
            )  # fmt: skip
        suite_reaper().hold(self.proc.pid)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fault upstream {self.name} exited:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=0.5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"fault upstream {self.name} did not start")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: the engine dies with its connections, as a crashed process does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._released()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._released()
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
        self._released()

    def _released(self) -> None:
        if self.proc is not None:
            suite_reaper().release(self.proc.pid)

    def fault(self, mode: str, **params: Any) -> None:
        """Sets the fault of the next `count` chat requests (all of them without count)."""
        response = httpx.post(f"{self.url}/_fault", json={"mode": mode, **params}, timeout=5)
        response.raise_for_status()

    def reset(self) -> None:
        """Normal answers at the default pace, counters zeroed."""
        self.fault("ok", tokens=self.tokens, token_delay_s=self.token_delay_s)
        httpx.delete(f"{self.url}/_stats", timeout=5).raise_for_status()

    def stats(self) -> dict[str, int]:
        response = httpx.get(f"{self.url}/_stats", timeout=5)
        response.raise_for_status()
        return {k: v for k, v in response.json().items() if isinstance(v, int)}


@contextmanager
def running_upstreams(
    names: list[str], log_dir: Path, *, tokens: int = 5, token_delay_s: float = 0.0
) -> Iterator[list[FaultUpstream]]:
    """Fault upstreams on free ports, all stopped on exit (also when one fails to start)."""
    upstreams = [
        FaultUpstream(name, free_port(), log_dir / f"upstream-{name}.log", tokens, token_delay_s)
        for name in names
    ]
    with ExitStack() as stack:
        for upstream in upstreams:
            stack.callback(upstream.stop)
            upstream.start()
        yield upstreams


def gateway_policy(
    main: list[FaultUpstream],
    spare: FaultUpstream,
    redis_url: str,
    *,
    max_inflight_per_replica: int = 64,
    total_s: float = 30.0,
) -> str:
    """Two pools: `main` (the model `main`, falling back to `spare`; `main-only` has no
    fallback) and `spare`. Small timeouts, tiny backoff, a breaker that reopens in 2 s."""
    replicas = ", ".join(f'{{url: "{u.url}"}}' for u in main)
    return f"""\
version: 1
health: {{interval_s: 0.5, timeout_s: 0.5, retry_after_s: 1}}
timeouts: {{connect_s: 1, first_byte_s: 2, idle_s: 2, total_s: {total_s}}}
state: {{redis_url: "{redis_url}"}}
routing: {{strategy: round_robin}}
resilience:
  breaker: {{consecutive_failures: 3, error_rate: 0.5, window_s: 10, min_calls: 20, open_s: 2}}
  retries: {{attempts: 3, backoff_base_s: 0.01, backoff_max_s: 0.05, retry_after_cap_s: 0.2}}
  admission: {{max_inflight_per_replica: {max_inflight_per_replica}}}
pools:
  {MAIN_POOL}:
    served_model: fault-main
    replicas: [{replicas}]
  {SPARE_POOL}:
    served_model: fault-spare
    replicas: [{{url: "{spare.url}"}}]
models:
  main: {{pool: {MAIN_POOL}, fallbacks: [spare]}}
  main-only: {{pool: {MAIN_POOL}}}
  spare: {{pool: {SPARE_POOL}}}
"""


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the gateway's /metrics (0 when it is absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
