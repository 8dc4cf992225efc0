"""The overhead benchmark's servers (mock engines, targets) never outlive it: a benchmark
killed with SIGKILL runs no `finally`, and the reaper it started stops them all the same
(tests/bench/overhead/targets.py, engine/lifeline.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from engine.lifeline import GRACE_S
from tests.fault.harness import ROOT
from tests.unit.edge.test_workers import alive  # a zombie, an orphan not reaped yet, is not

BENCH = """
import pathlib, sys
from tests.bench.overhead.targets import start_mock
mock = start_mock(0.0, pathlib.Path(sys.argv[1]))
print(mock.process.proc.pid, flush=True)
sys.stdin.read()  # until it is killed
"""


def test_a_killed_benchmark_leaves_no_server_behind(tmp_path: Path) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH, str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert bench.stdout is not None
        mock = int(bench.stdout.readline())
        assert alive(mock)
        bench.kill()
        bench.wait()
        deadline = time.monotonic() + GRACE_S + 5
        while alive(mock):
            assert time.monotonic() < deadline, "the mock engine outlived its benchmark"
            time.sleep(0.05)
    finally:
        bench.kill()
        bench.communicate()
