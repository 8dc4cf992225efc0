"""`gateway serve --workers 2` (gateway/edge/workers.py) as real processes against a fake
engine: both workers answer on the one port, /metrics sums them, SIGHUP reloads the policy
in every worker, SIGTERM stops them all, a SIGKILLed supervisor leaves no worker behind,
and a worker that dies is replaced.

Which worker answered is read from the access log: every line a worker writes names it
(`[w0-PID]`), and nothing is added to what clients receive."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from engine.supervisor import free_port
from gateway.cli import main
from tests.fault.harness import ROOT, FaultUpstream, metric, running_upstreams
from tests.lifetimes import alive, suite_reaper
from tests.policies import with_redis

WORKERS = 2
CONNECTIONS = 40  # each its own connection: all on one worker by chance is 2**-39
_TAG = re.compile(rb"^\[(w\d+)-(\d+)\] ", re.MULTILINE)


def policy_text(engine: FaultUpstream, redis_url: str, *, models: tuple[str, ...]) -> str:
    aliases = "\n".join(f"  {name}: {{pool: chat}}" for name in models)
    return with_redis(f"""\
version: 1
server: {{reload_interval_s: 0}}
pools:
  chat: {{served_model: fault-main, replicas: [{{url: "{engine.url}"}}]}}
models:
{aliases}
""", redis_url)  # fmt: skip


@dataclass
class Workers:
    supervisor: subprocess.Popen[bytes]
    base: str
    log: Path
    policy: Path

    def worker_pids(self) -> set[int]:
        return children(self.supervisor.pid)

    def tagged(self, text: bytes) -> set[str]:
        """The workers (`w0`, `w1`) that wrote a log line containing `text`."""
        found = set()
        for line in self.log.read_bytes().splitlines():
            tag = _TAG.match(line)
            if tag and text in line:
                found.add(tag.group(1).decode())
        return found

    def started(self, pid: int) -> bool:
        return any(
            tag.group(2) == str(pid).encode() and b"Application startup complete" in line
            for line in self.log.read_bytes().splitlines()
            if (tag := _TAG.match(line))
        )


def children(pid: int) -> set[int]:
    """Live (not zombie) processes whose parent is `pid`, from /proc."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def wait_for(condition: object, what: str, timeout_s: float = 60.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[FaultUpstream]:
    with running_upstreams(["a"], tmp_path) as (upstream,):
        yield upstream


@pytest.fixture
def workers(engine: FaultUpstream, redis_url: str, tmp_path: Path) -> Iterator[Workers]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text(engine, redis_url, models=("tiny",)))
    port = free_port()
    log = tmp_path / "gateway.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--policy", str(policy),
             "--port", str(port), "--workers", str(WORKERS), "--access-log", "--drain-s", "5"],
            cwd=ROOT,
            # The workers' metrics files: here, not a directory of the supervisor's own,
            # which a SIGKILLed supervisor could not remove.
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # held by the suite's reaper: gone with pytest
        )  # fmt: skip
    suite_reaper().hold(proc.pid)
    running = Workers(proc, f"http://127.0.0.1:{port}", log, policy)
    started: set[int] = set()
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"gateway exited:\n{log.read_text()}")
            return len(running.tagged(b"Application startup complete")) == WORKERS

        wait_for(ready, "both workers to start")
        started = running.worker_pids()
        yield running
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pid in started | children(proc.pid):  # never left behind, whatever the test did
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        suite_reaper().release(proc.pid)


def chat(base: str, model: str = "tiny") -> httpx.Response:
    """One request on a connection of its own (a fresh client each time)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)


def test_both_workers_answer_on_one_port_and_metrics_sum_them(
    workers: Workers, engine: FaultUpstream
) -> None:
    statuses = [chat(workers.base).status_code for _ in range(CONNECTIONS)]
    assert statuses == [200] * CONNECTIONS
    assert workers.tagged(b'"POST /v1/chat/completions HTTP/1.1" 200') == {"w0", "w1"}
    assert engine.stats()["completed"] == CONNECTIONS
    # Whichever worker a scrape reaches, it counts the requests of both.
    for _ in range(4):
        text = httpx.get(f"{workers.base}/metrics", timeout=10).text
        assert metric(text, "gateway_requests_total", model="tiny", status="200") == CONNECTIONS


def test_sighup_reloads_the_policy_in_every_worker(
    workers: Workers, engine: FaultUpstream, redis_url: str
) -> None:
    workers.policy.write_text(policy_text(engine, redis_url, models=("tiny", "added")))
    workers.supervisor.send_signal(signal.SIGHUP)
    wait_for(lambda: workers.tagged(b"SIGHUP: checking the policy file") == {"w0", "w1"},
             "SIGHUP in both workers")  # fmt: skip

    def every_worker_serves_the_new_model() -> bool:
        # Many connections, so both workers answer; each must know the new alias.
        return all(chat(workers.base, "added").status_code == 200 for _ in range(CONNECTIONS))

    wait_for(every_worker_serves_the_new_model, "the reloaded policy in both workers")
    assert workers.tagged(b'"POST /v1/chat/completions HTTP/1.1" 200') == {"w0", "w1"}
    assert workers.supervisor.poll() is None
    assert len(workers.worker_pids()) == WORKERS  # reloaded, not restarted


def test_sigterm_stops_every_worker(workers: Workers) -> None:
    pids = workers.worker_pids()
    assert len(pids) == WORKERS
    workers.supervisor.send_signal(signal.SIGTERM)
    assert workers.supervisor.wait(timeout=30) == 0
    assert not any(alive(pid) for pid in pids)
    assert b"gateway: stopped" in workers.log.read_bytes()


def test_a_killed_supervisor_leaves_no_worker(workers: Workers) -> None:
    pids = workers.worker_pids()
    assert len(pids) == WORKERS
    workers.supervisor.kill()
    workers.supervisor.wait(timeout=10)
    wait_for(lambda: not any(alive(pid) for pid in pids), "the workers to exit", timeout_s=30)


def test_a_dead_worker_is_replaced(workers: Workers) -> None:
    first = workers.worker_pids()
    victim = min(first)
    os.kill(victim, signal.SIGKILL)

    def replaced() -> bool:
        now = workers.worker_pids()
        return len(now) == WORKERS and victim not in now

    wait_for(replaced, "a new worker")
    (new,) = workers.worker_pids() - first
    wait_for(lambda: workers.started(new), "the new worker to start")
    assert [chat(workers.base).status_code for _ in range(10)] == [200] * 10
    assert workers.supervisor.poll() is None


def test_workers_without_a_shared_redis_are_refused_before_any_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each worker would start an embedded Redis of its own on one state directory."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"version: 1\nstate: {{embedded_dir: {tmp_path / 'state'}}}\n"
        'pools:\n  p: {served_model: m, replicas: [{url: "http://127.0.0.1:9"}]}\n'
        "models:\n  m: {pool: p}\n"
    )
    assert main(["serve", "--policy", str(policy), "--workers", "2"]) == 2
    assert "--workers 2 needs `state.redis_url`" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


def test_workers_that_cannot_start_are_not_restarted(
    tmp_path: Path,
    redis_url: str,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker refused its configuration (here an API keys file it cannot read) would be
    refused again: the supervisor stops and exits with the worker's status, 2, instead of
    restarting it five times."""
    missing = tmp_path / "missing-keys"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"version: 1\nstate: {{redis_url: '{redis_url}'}}\nauth: {{keys_file: '{missing}'}}\n"
        'pools:\n  p: {served_model: m, replicas: [{url: "http://127.0.0.1:9"}]}\n'
        "models:\n  m: {pool: p}\n"
    )
    port = str(free_port())
    assert main(["serve", "--policy", str(policy), "--workers", "2", "--port", port]) == 2
    assert f"gateway: cannot read the API keys file {missing}" in capfd.readouterr().err
    assert "it could not start as configured" in caplog.text
    assert "restarting" not in caplog.text
