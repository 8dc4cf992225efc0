"""A program started through gateway/lifetime/parent_death.py gets SIGTERM when the process
that started it dies, even by SIGKILL, and never starts for a parent that is already gone."""

from __future__ import annotations

import os
import subprocess
import sys

from gateway.lifetime import parent_death
from tests.lifetimes import kill_and_wait_gone, started_parent

PARENT = """
import subprocess
from gateway.lifetime import parent_death
child = subprocess.Popen(parent_death.command("/bin/sleep", "600"))
print(child.pid, flush=True)
child.wait()
"""


def test_the_program_dies_with_its_parent_even_by_sigkill() -> None:
    parent, program = started_parent(PARENT)
    kill_and_wait_gone(parent, program, timeout_s=10)


def test_a_parent_already_gone_starts_nothing() -> None:
    not_the_parent = os.getpid() + 1_000_000  # no process has it
    done = subprocess.run(
        [sys.executable, "-m", "gateway.lifetime.parent_death", str(not_the_parent), "/bin/true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert "exited before it started" in done.stderr


def test_the_command_runs_the_program_with_its_arguments() -> None:
    command = parent_death.command("/bin/echo", "kept")
    assert command[1:4] == ["-m", "gateway.lifetime.parent_death", str(os.getpid())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, "kept\n")
