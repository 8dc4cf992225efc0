"""The overhead benchmark's servers (mock engines, targets) never outlive it: a benchmark
killed with SIGKILL runs no `finally`, and the reaper it started stops them all the same
(tests/bench/overhead/targets.py, engine/lifeline.py)."""

from __future__ import annotations

from pathlib import Path

from engine.lifeline import GRACE_S
from tests.lifetimes import kill_and_wait_gone, started_parent

BENCH = """
import pathlib, sys
from tests.bench.overhead.targets import start_mock
mock = start_mock(0.0, pathlib.Path(sys.argv[1]))
print(mock.process.proc.pid, flush=True)
sys.stdin.read()  # until it is killed
"""


def test_a_killed_benchmark_leaves_no_server_behind(tmp_path: Path) -> None:
    bench, mock = started_parent(BENCH, str(tmp_path))
    kill_and_wait_gone(bench, mock, timeout_s=GRACE_S + 5)
