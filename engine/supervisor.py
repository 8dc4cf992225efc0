"""Start, watch and stop local vLLM replicas as background processes.

Each replica is its own process group (so stopping it stops vLLM's engine-core and worker
children too), listens on a free loopback port, and logs to its own file. `up` returns only
when every new replica answers `/health`, printing progress while it waits. Given a
`Lifeline` (engine/lifeline.py, as `engine stack` does), the replicas die with the process
that started them; without one (`engine up`) they outlive it until `engine down`.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.lifeline import Lifeline, group_exists
from engine.profiles import SERVER_MODULE, Profile, kv_events_endpoints
from engine.state import ReplicaRecord, read_state, write_state

ROOT = Path(__file__).resolve().parent.parent
# Set (e.g. by `make traces`): engines export their own spans there too.
OTLP_TRACES = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"


@dataclass(frozen=True)
class Paths:
    run: Path  # everything a local run writes: state file, logs, the gateway's store
    state: Path
    logs: Path
    python: Path

    @classmethod
    def default(cls) -> Paths:
        return cls.under(Path(os.environ.get("ENGINE_RUN_DIR", ROOT / ".run")))

    @classmethod
    def under(cls, run: Path) -> Paths:
        return cls(
            run=run,
            state=Path(os.environ.get("ENGINE_STATE", run / "engine-state.json")),
            logs=run / "engine-logs",
            python=Path(os.environ.get("ENGINE_PYTHON", ROOT / ".venv-engine" / "bin" / "python")),
        )


class EngineError(Exception):
    pass


# Handles of the replicas this process started. Replicas outlive `engine up` (they run in
# their own sessions), but while the starting process lives it must keep and finally reap
# its children: dropping a running Popen leaks a zombie and a ResourceWarning.
_children: dict[int, subprocess.Popen[bytes]] = {}


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PORTS_BELOW = 20_000  # how far under the ephemeral range free ports are looked for
_handed_out: set[int] = set()  # never the same port twice from one process


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a server about to start, chosen below the kernel's
    ephemeral range. A server may bind it a minute later (vLLM binds only once its model
    is loaded), and a port of the ephemeral range can be taken meanwhile as the local end
    of any outgoing connection on the machine: CI saw a gateway's port go that way. Below
    the range, only a server binding that very number can take it."""
    low = _ephemeral_start()
    if low - _PORTS_BELOW >= 1024:
        for _ in range(200):
            port = random.randrange(low - _PORTS_BELOW, low)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the kernel's choice
        s.bind((host, 0))
        chosen: int = s.getsockname()[1]
        return chosen


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def is_healthy(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Launch:
    profile: Profile
    count: int
    model: str
    pool: str | None = None


def up(
    launches: list[Launch],
    *,
    paths: Paths,
    host: str = "127.0.0.1",
    timeout_s: float = 600.0,
    say: Callable[[str], None] = print,
    lifeline: Lifeline | None = None,
) -> list[ReplicaRecord]:
    """Start every replica of every launch at once, then wait until all are healthy."""
    if not paths.python.exists():
        raise EngineError(
            f"no engine environment at {paths.python}; run `make engine-env` (or set ENGINE_PYTHON)"
        )
    paths.logs.mkdir(parents=True, exist_ok=True)
    started: list[tuple[ReplicaRecord, subprocess.Popen[bytes]]] = []
    try:
        for launch in launches:
            for _ in range(launch.count):
                started.append(
                    _start_one(launch, paths=paths, host=host, say=say, lifeline=lifeline)
                )
        _wait_healthy(started, timeout_s=timeout_s, say=say)
    except BaseException:
        stop_replicas([record.pid for record, _proc in started], lifeline=lifeline)
        raise
    records = [r for r, _ in started]
    current = [r for r in read_state(paths.state) if pid_alive(r.pid)]
    write_state(paths.state, current + records)
    return records


def _start_one(
    launch: Launch,
    *,
    paths: Paths,
    host: str,
    say: Callable[[str], None],
    lifeline: Lifeline | None,
) -> tuple[ReplicaRecord, subprocess.Popen[bytes]]:
    profile = launch.profile
    env = {**os.environ, **profile.serve_env(), "PYTHONUNBUFFERED": "1"}
    # Engines never reach a model hub here: a missing local file must fail, not hang.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    port = free_port(host)
    log_path = paths.logs / f"{profile.name}-{port}.log"
    args = profile.serve_args(model=launch.model, host=host, port=port)
    if not profile.otlp_traces_endpoint and (traces := os.environ.get(OTLP_TRACES)):
        # The gateway's trace receiver takes the engines' spans too: with the gateway's
        # traceparent they join the request's trace (agent -> gateway -> engine).
        args += ["--otlp-traces-endpoint", traces]
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        env["OTEL_SERVICE_NAME"] = f"vllm-{launch.pool or profile.pool}"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [str(paths.python), "-m", SERVER_MODULE, *args],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            env=env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    _children[proc.pid] = proc
    if lifeline is not None:
        lifeline.hold(proc.pid)  # its session id is its process group id
    record = ReplicaRecord(
        pool=launch.pool or profile.pool,
        profile=profile.name,
        served_model=profile.served_model,
        url=f"http://{host}:{port}",
        port=port,
        pid=proc.pid,
        log=str(log_path),
        # Where gateways follow this replica's KV-cache events (gateway/fleet/kv_events.py).
        **(_kv_fields(host, port) if profile.kv_events else {}),
    )
    say(f"engine: started {profile.name} on {record.url} (pid {proc.pid}, log {log_path})")
    return record, proc


def _wait_healthy(
    started: list[tuple[ReplicaRecord, subprocess.Popen[bytes]]],
    *,
    timeout_s: float,
    say: Callable[[str], None],
) -> None:
    begin = time.monotonic()
    waiting = {r.url: (r, p) for r, p in started}
    last_report = begin
    while waiting:
        for url, (record, proc) in list(waiting.items()):
            if proc.poll() is not None:
                tail = _tail(Path(record.log))
                raise EngineError(
                    f"replica {url} exited with code {proc.returncode} while starting; "
                    f"last lines of {record.log}:\n{tail}"
                )
            if is_healthy(url):
                say(f"engine: {url} healthy after {time.monotonic() - begin:.0f}s")
                del waiting[url]
        if not waiting:
            return
        now = time.monotonic()
        if now - begin > timeout_s:
            raise EngineError(f"replicas not healthy after {timeout_s:.0f}s: {', '.join(waiting)}")
        if now - last_report >= 10:
            say(f"engine: waiting for {len(waiting)} replica(s) to load ({now - begin:.0f}s)")
            last_report = now
        time.sleep(0.5)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def exit_code(pid: int) -> int | None:
    """None while the replica's API server runs; once it exited, its exit code (a negative
    signal number when a signal ended it; -1 when it was not started by this process)."""
    child = _children.get(pid)
    if child is not None:
        return child.poll()  # a dead child stays a zombie, which `kill(pid, 0)` finds
    return None if pid_alive(pid) else -1


def stop_replica(pid: int, grace_s: float = 20.0, lifeline: Lifeline | None = None) -> None:
    stop_replicas([pid], grace_s, lifeline)


def stop_replicas(pids: list[int], grace_s: float = 20.0, lifeline: Lifeline | None = None) -> None:
    """SIGTERM each replica's whole process group (vLLM's engine core and workers too), all
    at once so that stopping N replicas takes one grace, not N; SIGKILL what is left after
    the grace."""
    children = [child for pid in pids if (child := _children.pop(pid, None)) is not None]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    waiting = set(pids)
    while waiting and time.monotonic() < deadline:
        for child in children:
            child.poll()  # reap it as soon as it exits
        waiting = {pid for pid in waiting if group_exists(pid)}
        if waiting:
            time.sleep(0.2)
    for pid in waiting:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    for child in children:
        child.wait()
    if lifeline is not None:
        for pid in pids:
            lifeline.release(pid)


def down(
    paths: Paths,
    *,
    pool: str | None = None,
    say: Callable[[str], None] = print,
    lifeline: Lifeline | None = None,
) -> int:
    records = read_state(paths.state)
    stopping = [r for r in records if pool is None or r.pool == pool]
    keep = [r for r in records if r not in stopping]
    # Take them out of the state first, so the gateway stops routing to them.
    write_state(paths.state, keep)
    stop_replicas([record.pid for record in stopping], lifeline=lifeline)
    for record in stopping:
        say(f"engine: stopped {record.profile} replica {record.url} (pid {record.pid})")
    return len(stopping)


def status(paths: Paths) -> list[tuple[ReplicaRecord, bool, bool]]:
    return [(r, pid_alive(r.pid), is_healthy(r.url)) for r in read_state(paths.state)]


def build_tiny_model(
    out: Path, paths: Paths, *, seed: int = 0, say: Callable[[str], None] = print
) -> None:
    if not paths.python.exists():
        raise EngineError(f"no engine environment at {paths.python}; run `make engine-env`")
    say(f"engine: building the tiny model into {out} (offline, seed {seed})")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    result = subprocess.run(
        [str(paths.python), "-m", "engine.tiny_model", str(out), "--seed", str(seed)],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        raise EngineError(f"building the tiny model failed:\n{result.stdout}\n{result.stderr}")
    say(result.stdout.strip())


def validate_args(profile: Profile, paths: Paths) -> tuple[bool, str]:
    import json

    result = subprocess.run(
        [str(paths.python), "-m", "engine.validate_args"],
        input=json.dumps(profile.serve_args(port=8000)), cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    lines = result.stdout.strip().splitlines()
    message = lines[-1] if lines else (result.stderr.strip().splitlines() or ["no output"])[-1]
    if result.returncode != 0 and result.stderr.strip():
        message += "\n" + result.stderr.strip().splitlines()[-1]
    return result.returncode == 0, message


def _kv_fields(host: str, port: int) -> dict[str, str]:
    events, replay = kv_events_endpoints(host, port)
    return {"kv_events": events, "kv_replay": replay}
