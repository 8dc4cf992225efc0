"""Checks that what the project starts does not outlive what started it, however that ends:
a parent killed by SIGKILL runs no `finally`, so only the kernel or a reaper can stop its
children."""

from __future__ import annotations

import atexit
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

from engine.lifeline import Lifeline

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def suite_reaper() -> Lifeline:
    """This process's reaper for the servers tests and benchmarks start (engine/lifeline.py):
    each is started in a process group of its own and held from its start until it is
    stopped, and whatever is still held when this process ends, however it ends, is
    stopped. Started with the first server it holds; closed at a normal exit."""
    lifeline = Lifeline.start()
    atexit.register(lifeline.close)
    return lifeline


def alive(pid: int) -> bool:
    """Running, and not a zombie (an orphan whoever reaps orphans here has not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def started_parent(script: str, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """Runs the Python `script` with this repository importable; returns its process and
    the child pid the first line it prints names."""
    parent = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def kill_and_wait_gone(parent: subprocess.Popen[bytes], child: int, timeout_s: float) -> None:
    """SIGKILLs `parent`; fails unless `child` is gone within `timeout_s`."""
    try:
        assert alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + timeout_s
        while alive(child):
            assert time.monotonic() < deadline, f"process {child} outlived its parent"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.communicate()
