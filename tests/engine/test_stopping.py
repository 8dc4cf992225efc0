"""`make run` (`engine stack`) stops the way a person stops it, and takes every process it
started with it: vLLM's API server, engine core and worker, the gateway and its embedded
Redis, and the stack's reaper (engine/lifeline.py).

One test per way of stopping. SIGKILL, the one that used to orphan every replica, runs
against real vLLM. The others use a stand-in replica with vLLM's process tree
(tests/engine/stand_in_vllm.py), through `ENGINE_PYTHON`, so they take seconds instead of
minutes. The stack runs in a process group of its own, the way a terminal's foreground job
does, so "Ctrl-C" means SIGINT to that group.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine.lifeline import GRACE_S, Lifeline
from engine.profiles import SERVER_MODULE
from engine.supervisor import ROOT, free_port

STAND_IN = Path(__file__).with_name("stand_in_vllm.py")
READY = "Gateway ready"


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) from /proc, or None once the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces
    return int(fields[1]), fields[0], fields[19]


def descendants(root: int) -> dict[int, str]:
    """Every process under `root`, by pid, with its start time (pids are reused)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = (stat[0], stat[2])
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, started) in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = started
                frontier.append(pid)
    return found


def survivors(tree: dict[int, str]) -> list[int]:
    """Those still running (a zombie has ended; whether anyone reaps it is not ours)."""
    alive = []
    for pid, started in tree.items():
        stat = _stat(pid)
        if stat is not None and stat[2] == started and stat[1] != "Z":
            alive.append(pid)
    return alive


def wait_for_no_survivors(tree: dict[int, str], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := survivors(tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def command_lines(pids: list[int]) -> list[str]:
    lines = []
    for pid in pids:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            lines.append(f"{pid}: {cmd[:160]}")
    return lines


@dataclass
class Stack:
    process: subprocess.Popen[bytes]
    log: Path
    tree: dict[int, str] = field(default_factory=dict)
    output: bytearray = field(default_factory=bytearray)

    def text(self) -> str:
        return self.output.decode(errors="replace") + self.log.read_text(errors="replace")

    def wait_ready(self, timeout_s: float) -> None:
        """Until the stack prints that the gateway is ready; then its tree is recorded."""
        deadline = time.monotonic() + timeout_s
        while READY not in self.text():
            assert self.process.poll() is None, self.text()
            assert time.monotonic() < deadline, self.text()
            if self.process.stdout is not None:  # stdout is a pipe the test reads
                ready, _, _ = select.select([self.process.stdout], [], [], 0.5)
                if ready:
                    self.output += os.read(self.process.stdout.fileno(), 65536)
            else:
                time.sleep(0.5)
        self.tree = descendants(self.process.pid)

    def stop_everything(self) -> None:
        """Whatever a test did, nothing it started outlives it."""
        tree = {**self.tree, **descendants(self.process.pid)}
        for pid in [self.process.pid, *survivors(tree)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@contextlib.contextmanager
def stack(
    tmp_path: Path, lifeline: Lifeline, *, stand_in: bool, piped: bool = False, **knobs: str
) -> Iterator[Stack]:
    """`make run`'s stack, its own process group as a terminal's foreground job, held by the
    suite's reaper too: a killed pytest leaves no stack behind."""
    env = {**os.environ, "ENGINE_RUN_DIR": str(tmp_path), "GATEWAY_PORT": str(free_port())}
    for name in ("REDIS_URL", "ENGINE_STATE", "GATEWAY_POLICY", "ENGINE_PYTHON"):
        env.pop(name, None)  # the defaults `make run` uses on a fresh machine
    if stand_in:
        python = tmp_path / "stand-in-python"
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STAND_IN}" "$@"\n')
        python.chmod(0o755)
        env["ENGINE_PYTHON"] = str(python)  # what the stack runs as vLLM's python
        # The stand-in loads no model: naming one keeps the stack from building the tiny
        # model with the stand-in's python (these tests ran only after one that built it).
        model = tmp_path / "stand-in-model"
        model.mkdir()
        env["ENGINE_MODEL"] = str(model)
    env.update(knobs)
    log = tmp_path / "stack.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "engine", "stack"], cwd=ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if piped else out, stderr=out,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )  # fmt: skip
    lifeline.hold(process.pid)
    running = Stack(process, log)
    try:
        yield running
    finally:
        running.stop_everything()
        lifeline.release(process.pid)


def assert_stopped_cleanly(running: Stack, code: int) -> None:
    left = wait_for_no_survivors(running.tree, timeout_s=5)
    assert not left, "\n".join(command_lines(left))
    printed = running.text()
    assert code == 0, printed
    assert "Traceback" not in printed and "Exception ignored" not in printed, printed
    assert "gateway: stopped" in printed and printed.rstrip().endswith("engine: stopped"), printed


def test_ctrl_c_stops_every_process_without_a_traceback(
    tmp_path: Path, engine_lifeline: Lifeline
) -> None:
    with stack(tmp_path, engine_lifeline, stand_in=True) as running:
        running.wait_ready(timeout_s=120)
        assert len(running.tree) >= 3 * 3 + 1  # 3 replicas of 3 processes each, the gateway
        os.killpg(running.process.pid, signal.SIGINT)
        code = running.process.wait(timeout=60)
        assert_stopped_cleanly(running, code)


def test_sigterm_stops_every_process(tmp_path: Path, engine_lifeline: Lifeline) -> None:
    with stack(tmp_path, engine_lifeline, stand_in=True) as running:
        running.wait_ready(timeout_s=120)
        running.process.send_signal(signal.SIGTERM)
        code = running.process.wait(timeout=60)
        assert_stopped_cleanly(running, code)


def test_ctrl_c_with_stdout_closed_still_stops_every_process(
    tmp_path: Path, engine_lifeline: Lifeline
) -> None:
    """`make run | tee run.log`, then Ctrl-C: tee is gone before the stack says anything."""
    with stack(tmp_path, engine_lifeline, stand_in=True, piped=True) as running:
        running.wait_ready(timeout_s=120)
        assert running.process.stdout is not None
        running.process.stdout.close()
        os.killpg(running.process.pid, signal.SIGINT)
        code = running.process.wait(timeout=60)
        left = wait_for_no_survivors(running.tree, timeout_s=5)
        assert not left, "\n".join(command_lines(left))
        errors = running.log.read_text(errors="replace")  # stderr still has a reader
        assert code == 0, errors
        assert "Traceback" not in errors and "Exception ignored" not in errors, errors


@pytest.mark.engine
def test_sigkill_of_the_stack_takes_real_vllm_with_it(
    tmp_path: Path, engine_lifeline: Lifeline
) -> None:
    """The stack cannot stop anything itself here: its reaper does (engine/lifeline.py)."""
    with stack(
        tmp_path, engine_lifeline, stand_in=False, ENGINE_REPLICAS="1", ENGINE_EMBED_PROFILE=""
    ) as running:
        running.wait_ready(timeout_s=900)
        [api_server] = [p for p in running.tree if SERVER_MODULE in "".join(command_lines([p]))]
        replica = [pid for pid in running.tree if os.getpgid(pid) == api_server]
        assert len(replica) >= 2, command_lines(list(running.tree))  # its engine core too
        os.kill(running.process.pid, signal.SIGKILL)
        left = wait_for_no_survivors(running.tree, timeout_s=GRACE_S + 15)
        assert not left, "\n".join(command_lines(left))
