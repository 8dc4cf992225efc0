"""A generous time limit for a block that must not backtrack: when a regex falls back to a
backtracking engine, the test fails instead of hanging the suite.

Not a thread with a join timeout: Python's `re` holds the GIL while it matches, so the
waiting thread would never run. A SIGALRM is seen by `re` itself (it checks for signals
every few thousand steps) and raises in the test. Main thread only; Unix only.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class DeadlinePassed(Exception):
    pass


@contextmanager
def deadline(seconds: int = 10) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise DeadlinePassed(f"still running after {seconds} s: backtracking?")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
