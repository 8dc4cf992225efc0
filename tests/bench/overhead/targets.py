"""The processes of the overhead benchmark: the mock engines and the targets in front of them.

Each runs in its own process group (`start_new_session`), so stopping one ends its workers
too and nothing else; a target that fails to start raises `TargetUnavailable` with the end
of its log, and the benchmark goes on without it. Each group is also held by the process's
reaper (`tests.lifetimes.suite_reaper`) until it is stopped, so that none outlives a
benchmark ended by SIGTERM or SIGKILL, which run no `finally`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.supervisor import free_port
from tests.fault.harness import ROOT
from tests.lifetimes import suite_reaper

MOCK_MODEL = "bench-model"  # what the mock engine serves, as vLLM's --served-model-name
ALIAS = "bench"  # the name clients use at the gateway and LiteLLM
LITELLM_KEY = "sk-bench-local"  # LiteLLM's master key, for this loopback run only

LITELLM_VENV = ROOT / ".venv-litellm"
VLLM_ROUTER_VENV = ROOT / ".venv-vllm-router"
PORTKEY_DIR = ROOT / ".node-portkey"
PORTKEY_ENTRY = "node_modules/@portkey-ai/gateway/build/start-server.js"
PEERS_STATUS = ROOT / ".run/bench/peers.txt"

OUR_PYTHON = {"PYTHONPATH": str(ROOT)}  # for this repository's modules; never for the peers

ALL_TARGETS = ("direct", "passthrough", "gateway", "litellm", "vllm-router", "portkey")


def gateway_target(workers: int) -> str:
    """The target name of the gateway run as `gateway serve --workers N`."""
    return "gateway" if workers == 1 else f"gateway-{workers}w"


def gateway_workers(name: str) -> int | None:
    """`gateway` -> 1, `gateway-2w` -> 2; None for any other target."""
    if name == "gateway":
        return 1
    if name.startswith("gateway-") and name.endswith("w") and name[8:-1].isdigit():
        return int(name[8:-1])
    return None


class TargetUnavailable(RuntimeError):
    """A target that is not installed or did not start; the message says why."""


@dataclass
class Process:
    """A started server: its process group is ended on stop."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        except ProcessLookupError:
            pass
        finally:
            suite_reaper().release(self.proc.pid)

    def peak_rss_mb(self) -> float:
        """VmHWM of the process and every descendant, summed (an upper bound when the
        workers' peaks did not coincide)."""
        return _sum_status(self.proc.pid, "VmHWM")

    def rss_mb(self) -> float:
        return _sum_status(self.proc.pid, "VmRSS")

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and every descendant so far."""
        ticks = 0
        for each in _descendants(self.proc.pid):
            try:
                fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    """The process and every descendant, from /proc (parents read from each `stat`)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (field 2) may hold spaces: the parent follows its ")".
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue.extend(children.get(current, []))
    return found


def _sum_status(pid: int, field_name: str) -> float:
    total_kb = 0
    for each in _descendants(pid):
        try:
            for line in Path(f"/proc/{each}/status").read_text().splitlines():
                if line.startswith(field_name + ":"):
                    total_kb += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return round(total_kb / 1024, 1)


def spawn(
    name: str,
    command: list[str],
    log: Path,
    ready_url: str,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 90.0,
) -> Process:
    """Starts `command` (in the log's directory unless `cwd`) and waits until `ready_url`
    answers 200."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command,
            cwd=cwd or log.parent,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    suite_reaper().hold(proc.pid)  # its group: the leader's pid
    process = Process(name, proc, log)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(ready_url, timeout=1.0).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            process.stop()
            tail = log.read_text(errors="replace")[-1500:]
            raise TargetUnavailable(f"{name} did not start (see {log}):\n{tail}")
        time.sleep(0.1)


def wait_for_workers(process: Process, workers: int, timeout_s: float = 90.0) -> None:
    """/readyz answers once one worker serves; the others listen only once started
    (gateway/edge/workers.py), so a run timed before would measure fewer workers."""
    deadline = time.monotonic() + timeout_s
    while process.log.read_text(errors="replace").count("Application startup complete") < workers:
        if process.proc.poll() is not None or time.monotonic() > deadline:
            process.stop()
            raise TargetUnavailable(f"{process.name}: not every worker started ({process.log})")
        time.sleep(0.1)


@dataclass
class Mock:
    """A mock engine (`mock_upstream`) with a fixed service time."""

    service_ms: float
    process: Process
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_mock(service_ms: float, work: Path) -> Mock:
    port = free_port()
    command = [sys.executable, "-m", "tests.bench.overhead.mock_upstream", "--port", str(port),
               "--model", MOCK_MODEL, "--service-ms", str(service_ms)]  # fmt: skip
    log = work / f"mock-{service_ms:g}ms.log"
    ready = f"http://127.0.0.1:{port}/health"
    process = spawn(f"mock {service_ms:g} ms", command, log, ready, env=OUR_PYTHON)
    return Mock(service_ms, process, port)


@dataclass
class Running:
    """A target ready for load: where to send, what model name, which headers."""

    name: str
    base: str
    model: str
    process: Process  # for direct, the mock itself
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def chat_url(self) -> str:
        return f"{self.base}/v1/chat/completions"


def missing_peer(name: str) -> str | None:
    """Why a peer cannot run (not built, or its build failed), or None when it can."""
    paths = {
        "litellm": LITELLM_VENV / "bin/litellm",
        "vllm-router": VLLM_ROUTER_VENV / "bin/vllm-router",
        "portkey": PORTKEY_DIR / PORTKEY_ENTRY,
    }
    if name not in paths or paths[name].exists():
        return None
    if PEERS_STATUS.exists():
        for line in PEERS_STATUS.read_text().splitlines():
            peer, outcome, detail = [*line.split("\t"), "", ""][:3]
            if peer == name and outcome != "ok":
                return f"build failed: {detail}"
    return "not built: run `bash tests/bench/overhead/peers-env.sh` (make bench does)"


@contextmanager
def running(
    name: str, mock: Mock, work: Path, sink: str, redis_url: str, sharing: str | None = None
) -> Iterator[Running]:
    """Starts target `name` in front of `mock`; stops it on exit. `sharing`: the gateways'
    `routing.sharing` as a YAML flow mapping (None: the policy's defaults)."""
    if name == "direct":
        yield Running(name, mock.url, MOCK_MODEL, mock.process)
        return
    reason = missing_peer(name)
    if reason:
        raise TargetUnavailable(reason)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    tag = f"{name}-{mock.service_ms:g}ms"
    log = work / f"{tag}.log"
    headers: dict[str, str] = {}
    model = MOCK_MODEL
    if name == "passthrough":
        command = [sys.executable, "-m", "tests.bench.overhead.passthrough", "--port", str(port),
                   "--upstream", mock.url]  # fmt: skip
        process = spawn(name, command, log, f"{base}/health", env=OUR_PYTHON)
    elif (workers := gateway_workers(name)) is not None:
        policy = work / f"{tag}-policy.yaml"
        policy.write_text(gateway_policy(mock.url, sink, redis_url, sharing))
        command = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy),
                   "--port", str(port), "--workers", str(workers)]  # fmt: skip
        process = spawn(name, command, log, f"{base}/readyz", env=OUR_PYTHON, cwd=ROOT)
        if workers > 1:
            wait_for_workers(process, workers)
        model = ALIAS
    elif name == "litellm":
        config = work / f"{tag}-config.yaml"
        config.write_text(litellm_config(mock.url))
        command = [str(LITELLM_VENV / "bin/litellm"), "--config", str(config),
                   "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        headers = {"Authorization": f"Bearer {LITELLM_KEY}"}
        process = spawn(name, command, log, f"{base}/health/liveliness", env=LITELLM_ENV)
        model = ALIAS
    elif name == "vllm-router":
        # cache_aware: the router's prefix-tree routing, the counterpart of the gateway's
        # default cache-aware routing (one worker, so the choice is the same; the work isn't).
        command = [str(VLLM_ROUTER_VENV / "bin/vllm-router"), "--host", "127.0.0.1",
                   "--port", str(port), "--worker-urls", mock.url, "--policy", "cache_aware",
                   "--prometheus-port", str(free_port())]  # fmt: skip
        process = spawn(name, command, log, f"{base}/health")
    elif name == "portkey":
        # --headless: no web UI and no log stream to it. Portkey routes by headers: the
        # OpenAI provider, pointed at the mock. (It listens on every interface; it has no
        # host option.)
        command = ["node", str(PORTKEY_DIR / PORTKEY_ENTRY), f"--port={port}", "--headless"]
        headers = {
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": f"{mock.url}/v1",
            "Authorization": "Bearer unused",
        }
        process = spawn(name, command, log, f"{base}/")
    else:
        raise ValueError(f"unknown target {name}")
    try:
        yield Running(name, base, model, process, headers)
    finally:
        process.stop()


def gateway_policy(upstream: str, sink: str, redis_url: str, sharing: str | None = None) -> str:
    """One pool, the mock its replica, every default on (canonicalization, cache-aware
    routing, breaker, retries, metrics, usage ledger, tracing at the default 0.1 sampling
    to a local OTLP sink). One change: admission's in-flight cap per replica (default 64)
    is raised to 256, or half the requests at concurrency 128 would get a fast 429 and
    flatter the figures; the mock, unlike an engine, is never full. `sharing`, when given,
    is written as `routing.sharing` (what sharing costs: `--sharing '{enabled: false}'`)."""
    routing = f"routing: {{sharing: {sharing}}}\n" if sharing else ""
    return f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
{routing}telemetry:
  traces: {{endpoint: "{sink}", sample_ratio: 0.1}}
resilience:
  admission: {{max_inflight_per_replica: 256}}
pools:
  {ALIAS}:
    served_model: {MOCK_MODEL}
    replicas: [{{url: "{upstream}"}}]
models:
  {ALIAS}: {{pool: {ALIAS}}}
"""


# LiteLLM measured as it ships, less its own logging: the uvicorn access log and INFO logs
# (LITELLM_LOG=WARNING), spend and error logs (no database here anyway), debug info. No
# callbacks, no cache, one worker (its default). The local cost map keeps it offline.
LITELLM_ENV = {
    "LITELLM_MASTER_KEY": LITELLM_KEY,
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "WARNING",
}


def litellm_config(upstream: str) -> str:
    return f"""\
model_list:
  - model_name: {ALIAS}
    litellm_params:
      model: hosted_vllm/{MOCK_MODEL}
      api_base: {upstream}/v1
      api_key: unused
litellm_settings:
  suppress_debug_info: true
general_settings:
  disable_spend_logs: true
  disable_error_logs: true
"""
