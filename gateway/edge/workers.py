"""`gateway serve --workers N`: N processes serve one port, so a pod uses more than one core.

One Python process serves about one core (the event loop and the GIL). With N > 1 the
process `gateway serve` starts is a supervisor: it checks the policy and the port, then
starts N workers (`gateway serve` again, told by `GATEWAY_WORKER=i` that it is worker i
of `GATEWAY_WORKERS`) and serves nothing itself.

- **One port, N listening sockets.** Each worker binds host:port itself with
  `SO_REUSEPORT` (`shared_port_socket`), so the kernel spreads new connections over the
  workers' accept queues by a hash of the connection's addresses. uvicorn's own
  `--workers` shares one socket instead (the workers race to accept, and a busy asyncio
  loop keeps winning), needs the app as an import string, and treats SIGHUP as "restart
  every worker"; here SIGHUP is the policy reload, which must not drop a connection.
- **Signals are forwarded.** SIGTERM and SIGINT reach every worker once (each drains for
  `--drain-s`, then the supervisor exits with them); SIGHUP reaches every worker, and each
  re-reads the policy file as a single `gateway serve` does. The workers run in process
  groups of their own, so a terminal's Ctrl-C reaches them once, through the supervisor,
  not twice (a second SIGINT makes uvicorn skip the drain).
- **Workers die with the supervisor**, even when it is SIGKILLed: each asks the kernel
  for SIGTERM when its parent dies (`PR_SET_PDEATHSIG`) and checks it still has the parent
  that started it (the supervisor may have died before the request took effect).
- **A worker that dies is restarted**, at most `RestartBudget.max_restarts` times within
  `window_s`, as the engine watchdog does: one crashed worker (a native crash, the OOM
  killer) must not stop the pod's others, and Kubernetes cannot see it (the port is still
  served). A worker that keeps dying means the gateway cannot serve as configured: the
  supervisor then stops every worker and exits 1, and Kubernetes restarts the pod. A
  worker that exits 2 or 3 refused to start (an unreadable file the policy names, a
  failed start-up): it is not restarted; the supervisor stops and exits with its status.
- **Metrics are the pod's, summed over workers.** A scrape reaches one worker, chosen by
  the kernel, so each worker's own registry would show a random share. The supervisor
  gives the workers a fresh `PROMETHEUS_MULTIPROC_DIR` (prometheus_client's multiprocess
  mode, gateway/telemetry/metrics.py): counters and histograms are summed over workers,
  gauges carry a `pid` label. Measured on the 2-core machine: about 2.5 us more per
  counter or histogram update (docs/operations/sizing.md).
- **Each worker knows who it is**: `worker_identity()` (the index and the process id), for
  whatever names a gateway process to the others (gateway/sharing/ publishes placements
  under one id per process).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from gateway.lifetime.parent_death import ask_for_sigterm_when_parent_dies

log = logging.getLogger("gateway.edge.workers")

WORKER_ENV = "GATEWAY_WORKER"  # this process's index, 0..N-1
WORKERS_ENV = "GATEWAY_WORKERS"  # N
SUPERVISOR_ENV = "GATEWAY_SUPERVISOR_PID"
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's name for it

_POLL_S = 0.2
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class WorkerIdentity:
    index: int
    count: int
    pid: int

    @property
    def name(self) -> str:
        """`w1-12345`: readable in a log line and unique on the host while it runs."""
        return f"w{self.index}-{self.pid}"


def worker_identity() -> WorkerIdentity | None:
    """This process's place among the workers of `gateway serve --workers N`; None in a
    gateway of one process."""
    index = os.environ.get(WORKER_ENV)
    if index is None:
        return None
    return WorkerIdentity(int(index), int(os.environ.get(WORKERS_ENV, "1")), os.getpid())


def die_with_supervisor() -> None:
    """In a worker: ask for SIGTERM when the supervisor dies, even by SIGKILL (the worker
    then drains and exits), and exit now if it is already gone."""
    supervisor = os.environ.get(SUPERVISOR_ENV)
    if not ask_for_sigterm_when_parent_dies(int(supervisor) if supervisor is not None else None):
        raise SystemExit("gateway: the supervisor exited before this worker started")


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def shared_port_socket(host: str, port: int) -> socket.socket:
    """A worker's own socket on the shared port (`SO_REUSEPORT`), bound but not yet
    listening: uvicorn's `create_server` listens once the app has started, so the kernel
    sends no connection to a worker still starting (or restarting) while others serve."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def check_port_free(host: str, port: int) -> None:
    """Raises OSError if anything listens on host:port. Bound without `SO_REUSEPORT`, so
    a gateway still running there (whose sockets do allow sharing) is found too, rather
    than silently sharing its port with this one."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


@dataclass
class RestartBudget:
    """At most `max_restarts` restarts of any worker within `window_s`."""

    max_restarts: int = 5
    window_s: float = 60.0
    _times: list[float] = field(default_factory=list)

    def allow(self, now: float) -> bool:
        self._times = [t for t in self._times if now - t < self.window_s]
        if len(self._times) >= self.max_restarts:
            return False
        self._times.append(now)
        return True


# `gateway serve`'s exit statuses for a start it refused (gateway/cli/serve.py): a file the
# policy names cannot be read (2), a start-up that failed (3, uvicorn's). Starting again
# would fail again; the supervisor stops with the same status, as one process would.
_DID_NOT_START = frozenset({2, 3})


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


class Supervisor:
    """Starts `count` workers running `worker_argv` (a `gateway serve` command line),
    forwards signals to them, restarts those that die within the budget, and returns the
    exit status once they have all stopped."""

    def __init__(
        self,
        worker_argv: Sequence[str],
        count: int,
        *,
        stop_timeout_s: float,
        budget: RestartBudget | None = None,
    ) -> None:
        self._argv = list(worker_argv)
        self._count = count
        self._stop_timeout_s = stop_timeout_s
        self._budget = budget or RestartBudget()
        self._workers: dict[int, subprocess.Popen[bytes]] = {}  # index -> process
        self._stopping: int | None = None  # the signal that asked for the stop
        self._stop_deadline = 0.0
        self._status = 0
        self._metrics_dir: str | None = None

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _FORWARDED}
        self._metrics_dir = self._fresh_metrics_dir()
        try:
            for index in range(self._count):
                if self._stopping is None:  # a stop while starting: start no more
                    self._start(index)
            while self._workers:
                self._reap()
                if self._stopping is not None and time.monotonic() > self._stop_deadline:
                    self._kill_all()
                time.sleep(_POLL_S)
            return self._status
        finally:
            self._kill_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._metrics_dir is not None and METRICS_DIR_ENV not in os.environ:
                shutil.rmtree(self._metrics_dir, ignore_errors=True)

    @staticmethod
    def _fresh_metrics_dir() -> str:
        """The operator's `PROMETHEUS_MULTIPROC_DIR` (emptied: files of a previous run
        would be summed in), or a directory of this run's own."""
        given = os.environ.get(METRICS_DIR_ENV)
        if given is None:
            return tempfile.mkdtemp(prefix="gateway-metrics-")
        os.makedirs(given, exist_ok=True)
        for name in os.listdir(given):
            if name.endswith(".db"):
                os.remove(os.path.join(given, name))
        return given

    def _start(self, index: int) -> None:
        assert self._metrics_dir is not None
        env = {
            **os.environ,
            WORKER_ENV: str(index),
            WORKERS_ENV: str(self._count),
            SUPERVISOR_ENV: str(os.getpid()),
            METRICS_DIR_ENV: self._metrics_dir,
        }
        # A process group of its own: a terminal's Ctrl-C reaches the worker once, from here.
        # SIGHUP ignored until the worker's app installs its reload handler (an ignored
        # signal stays ignored across exec): one forwarded while it starts must not kill it,
        # and it reads the file as it is then anyway. (No threads here: preexec_fn is safe.)
        proc = subprocess.Popen([sys.executable, "-m", "gateway", *self._argv], env=env,
                                process_group=0, preexec_fn=_ignore_sighup)  # fmt: skip
        self._workers[index] = proc
        log.info("worker %d started (pid %d)", index, proc.pid)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            log.info("SIGHUP: forwarded to %d worker(s)", len(self._workers))
        elif self._stopping is None:
            self._stopping = signum
            self._stop_deadline = time.monotonic() + self._stop_timeout_s
        else:
            return  # each worker is already draining; a second signal would cut that short
        for proc in self._workers.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    def _reap(self) -> None:
        for index, proc in list(self._workers.items()):
            code = proc.poll()
            if code is None:
                continue
            del self._workers[index]
            self._forget_metrics(proc.pid)
            if self._stopping is not None:
                continue
            if code in _DID_NOT_START:
                log.error(
                    "worker %d (pid %d) exited with %d: it could not start as configured "
                    "(its message says why); stopping",
                    index,
                    proc.pid,
                    code,
                )
                self._status = code
                self._on_signal(signal.SIGTERM, None)
                continue
            if self._budget.allow(time.monotonic()):
                log.warning("worker %d (pid %d) exited with %d: restarting", index, proc.pid, code)
                self._start(index)
                continue
            log.error(
                "worker %d (pid %d) exited with %d, more than %d restarts in %g s: stopping",
                index,
                proc.pid,
                code,
                self._budget.max_restarts,
                self._budget.window_s,
            )
            self._status = 1
            self._on_signal(signal.SIGTERM, None)

    def _forget_metrics(self, pid: int) -> None:
        """A dead worker's gauges go (they described a process that is gone); its
        counters and histograms stay in the sums, as a counter must never go down."""
        if self._metrics_dir is None:
            return
        for name in os.listdir(self._metrics_dir):
            if name.startswith("gauge_") and name.endswith(f"_{pid}.db"):
                os.remove(os.path.join(self._metrics_dir, name))

    def _kill_all(self) -> None:
        for proc in self._workers.values():
            if proc.poll() is None:
                log.warning("worker (pid %d) did not stop in time: killed", proc.pid)
                proc.kill()
            proc.wait()
        self._workers.clear()


def tagged_log_config(config: dict[str, Any], identity: WorkerIdentity) -> dict[str, Any]:
    """A `logging.config.dictConfig` mapping (uvicorn's) whose every line names the worker:
    the N workers write to one stdout."""
    out = copy.deepcopy(config)
    for formatter in out.get("formatters", {}).values():
        if "fmt" in formatter:
            formatter["fmt"] = f"[{identity.name}] {formatter['fmt']}"
    return out
