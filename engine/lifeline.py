"""The processes `engine stack` starts never outlive it, however it ends.

While the stack runs, it stops its replicas and its gateway itself on Ctrl-C, SIGTERM or
SIGHUP (engine/stack.py). Nothing stops them when the stack cannot: SIGKILL, the OOM killer,
a crash. Each replica runs in a process group of its own (engine/supervisor.py), so no signal
aimed at the stack reaches it. `PR_SET_PDEATHSIG` would reach only the API server the stack
starts, because the kernel clears it in every child the API server forks. vLLM's engine core
does not watch its parent either: once orphaned, it goes on generating, and on a GPU host it
keeps the GPU's memory. (Its workers do watch the engine core, through a pipe.)

So the stack first starts a reaper (`python -m engine.lifeline FD`). The reaper runs in a
session of its own, where neither Ctrl-C nor a closed terminal reaches it, and reads the
stack's end of a pipe. The stack writes a line for each process group it starts (`+PGID`) and
for each one it has stopped (`-PGID`). The kernel closes a dead process's descriptors, so
however the stack ends, the reaper reads end-of-file. It then SIGTERMs every group still
held, SIGKILLs whatever is left after a grace period, and exits. `killpg` reaches vLLM's engine
core and workers, which stay in their API server's group, even after the API server has exited.
Stopped groups are released so that the reaper never signals a group id the kernel has since
reused.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 10.0  # vLLM frees its memory on SIGTERM within seconds; then SIGKILL
_ROOT = Path(__file__).resolve().parent.parent


class Lifeline:
    """The stack's end of the pipe to its reaper."""

    def __init__(self, reaper: subprocess.Popen[bytes], pipe: int) -> None:
        self._reaper = reaper
        self._pipe = pipe

    @classmethod
    def start(cls) -> Lifeline:
        read_end, write_end = os.pipe()  # not inheritable: only the reaper gets read_end
        try:
            reaper = subprocess.Popen(
                [sys.executable, "-m", "engine.lifeline", str(read_end)],
                pass_fds=(read_end,), cwd=_ROOT, start_new_session=True,
                # No terminal or pipe that may close before the reaper is done with it.
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            os.close(read_end)
        return cls(reaper, write_end)

    def hold(self, pgid: int) -> None:
        """The reaper kills this process group if the stack dies before it releases it."""
        self._send(f"+{pgid}")

    def release(self, pgid: int) -> None:
        """The group was stopped."""
        self._send(f"-{pgid}")

    def close(self) -> None:
        """The stack's normal end: the reaper stops what is still held (normally nothing)."""
        with contextlib.suppress(OSError):
            os.close(self._pipe)
        try:
            self._reaper.wait(timeout=GRACE_S + 5)
        except subprocess.TimeoutExpired:
            self._reaper.kill()
            self._reaper.wait()

    def _send(self, line: str) -> None:
        # One short write is atomic on a pipe. A reaper that is gone (someone killed it)
        # costs this safety net, not the stack.
        with contextlib.suppress(OSError):
            os.write(self._pipe, f"{line}\n".encode())


def stop_groups(pgids: set[int], grace_s: float = GRACE_S) -> None:
    """SIGTERM every group, SIGKILL those still alive after the grace."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = set(pgids)
    while alive and time.monotonic() < deadline:
        alive = {pgid for pgid in alive if group_exists(pgid)}
        time.sleep(0.1)
    for pgid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(pipe: int, grace_s: float = GRACE_S) -> None:
    """Hold the groups the stack names until its end of the pipe closes, then stop them."""
    held: set[int] = set()
    with os.fdopen(pipe, "rb") as lines:
        for line in lines:
            text = line.decode("ascii", "replace").strip()
            if text[:1] == "+" and text[1:].isdigit():
                held.add(int(text[1:]))
            elif text[:1] == "-" and text[1:].isdigit():
                held.discard(int(text[1:]))
    stop_groups(held, grace_s)


def main(argv: list[str]) -> int:
    for signum in (signal.SIGINT, signal.SIGHUP):  # the stack decides; the pipe tells
        signal.signal(signum, signal.SIG_IGN)
    reap(int(argv[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
