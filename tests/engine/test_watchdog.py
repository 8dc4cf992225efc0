"""`engine stack`'s watchdog (engine/watchdog.py), with a stand-in for vLLM's server: a
process that answers /health and, like vLLM's API server, has a child in its process group
(the engine core) that outlives it. The real stack is covered by test_make_run.py."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from engine.profiles import load_profile
from engine.state import read_state
from engine.supervisor import Launch, Paths, down, is_healthy, pid_alive, up
from engine.watchdog import ReplicaWatchdog

FAKE_SERVER = f"""#!{sys.executable}
import http.server, os, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(os.environ["FAKE_CORES"] + f"/{{os.getpid()}}", "w").write(str(core.pid))

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    server = tmp_path / "fake-python"
    server.write_text(FAKE_SERVER)
    server.chmod(0o755)
    cores = tmp_path / "cores"
    cores.mkdir()
    monkeypatch.setenv("FAKE_CORES", str(cores))
    return Paths(tmp_path, tmp_path / "engine-state.json", tmp_path / "logs", server)


def engine_core_of(paths: Paths, pid: int) -> int:
    return int((paths.run / "cores" / str(pid)).read_text())


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_replica_that_died_is_stopped_whole_and_replaced(paths: Paths) -> None:
    launch = Launch(load_profile("cpu-tiny"), 2, "model")
    said: list[str] = []
    watchdog = ReplicaWatchdog([launch], paths, say=said.append)
    first, second = up([launch], paths=paths, say=said.append, timeout_s=30)
    try:
        core = engine_core_of(paths, first.pid)
        watchdog.check()  # all well: nothing happens
        assert read_state(paths.state) == [first, second]

        os.kill(first.pid, signal.SIGKILL)  # the API server alone, as a crash does
        os.waitid(os.P_PID, first.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
        assert pid_alive(core)  # orphaned, as vLLM's engine core is
        watchdog.check()

        assert wait_gone(core), "the dead replica's engine core still runs"
        replicas = read_state(paths.state)
        assert second in replicas and first not in replicas and len(replicas) == 2
        [new] = [r for r in replicas if r != second]
        assert is_healthy(new.url)
        assert any("killed by signal 9" in line and "new replica" in line for line in said)
    finally:
        down(paths, say=said.append)


def test_a_replica_that_keeps_dying_is_left_down(paths: Paths) -> None:
    launch = Launch(load_profile("cpu-tiny"), 1, "model")
    said: list[str] = []
    watchdog = ReplicaWatchdog([launch], paths, say=said.append, max_restarts=1)
    up([launch], paths=paths, say=said.append, timeout_s=30)
    try:
        for _ in range(2):
            [replica] = read_state(paths.state)
            os.kill(replica.pid, signal.SIGKILL)
            os.waitid(os.P_PID, replica.pid, os.WEXITED | os.WNOWAIT)
            watchdog.check()
        assert read_state(paths.state) == []  # the gateway routes to it no more
        assert "not restarted (1 restarts in the last 600s)" in said[-1]
        assert replica.log in said[-1]
    finally:
        down(paths, say=said.append)
