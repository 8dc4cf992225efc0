"""Children that must not outlive the gateway process that started them, even when it is
killed by SIGKILL or the OOM killer, which run no cleanup.

`ask_for_sigterm_when_parent_dies` asks the kernel for SIGTERM when the parent dies
(`PR_SET_PDEATHSIG`) and says whether the parent is still there (it may have died before
the request took effect). A worker of `gateway serve --workers N` calls it for itself
(gateway/edge/workers.py). A program that is not Python is started through this module:

    python -m gateway.lifetime.parent_death PARENT_PID PROGRAM [ARGS...]

asks for the same, then becomes PROGRAM (`execv`; the request survives it), so that
PROGRAM gets SIGTERM when PARENT_PID dies. The embedded redis-server is started this way
(gateway/state/store.py).

The kernel sends the signal when the *thread* that forked the child ends, not the
process: start such children from the event loop's thread, which lives as long as the
gateway.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import NoReturn

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def ask_for_sigterm_when_parent_dies(parent: int | None = None) -> bool:
    """SIGTERM to this process when its parent dies. Returns whether `parent` (the pid that
    started it) is still its parent: if not, it died before the request took effect, and
    the caller should exit now."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return parent is None or os.getppid() == parent


def command(program: str, *args: str) -> list[str]:
    """The command line that runs `program` with `args` as a child that dies with this
    process."""
    return [sys.executable, "-m", __name__, str(os.getpid()), program, *args]


def main(argv: list[str]) -> NoReturn:
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit(
            "usage: python -m gateway.lifetime.parent_death PARENT_PID PROGRAM [ARGS...]"
        )
    if not ask_for_sigterm_when_parent_dies(int(argv[0])):
        raise SystemExit("the process that started this one exited before it started")
    os.execv(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
