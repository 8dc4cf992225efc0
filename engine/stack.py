"""`make run`: engines, then the gateway in front of them, until Ctrl-C; a replica that dies
is replaced meanwhile (engine/watchdog.py).

Stopping. Ctrl-C, SIGTERM and SIGHUP (a closed terminal) all stop the stack the same way,
once: later signals are ignored while it stops. The gateway runs in a process group of its
own, so a Ctrl-C at the terminal reaches the stack alone, and the gateway gets exactly one
SIGINT from the stack. (A second SIGINT is uvicorn's "force quit": it skips the lifespan
shutdown and logs a CancelledError traceback.) The replicas are then stopped together. Output
that can no longer be written (`make run | tee run.log`, with tee ended by the same Ctrl-C) is
dropped rather than allowed to end the stack halfway through stopping. If the stack dies
before it has stopped everything (SIGKILL), its reaper does the stopping (engine/lifeline.py).

Environment knobs (all optional):
    ENGINE_PROFILE (cpu-tiny)  ENGINE_REPLICAS (2)  ENGINE_MODEL (the profile's model)
    ENGINE_EMBED_PROFILE (cpu-tiny-embed for cpu profiles, none for gpu; empty for none)
    GATEWAY_POLICY (policies/default.yaml; policies/gpu.yaml for gpu profiles)
    GATEWAY_HOST (127.0.0.1)  GATEWAY_PORT (8080)
    REDIS_URL (unset: the gateway runs an embedded, durable Redis under .run/state)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import FrameType
from typing import TextIO

from engine.cli import resolve_model
from engine.lifeline import Lifeline, stop_groups
from engine.profiles import load_profile
from engine.supervisor import ROOT, EngineError, Launch, Paths, down, up
from engine.watchdog import ReplicaWatchdog

WATCH_INTERVAL_S = 2.0
GATEWAY_STOP_S = 30.0  # its drain, then SIGKILL
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _wait_ready(
    url: str, proc: subprocess.Popen[bytes], pools: set[str], timeout_s: float = 60.0
) -> None:
    """Until every model served by the pools we started has a healthy replica. (/readyz is
    503 while any model is down; a GPU policy may list models this run does not start.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineError(f"the gateway exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as resp:
                report = json.load(resp)
        except urllib.error.HTTPError as exc:
            report = json.load(exc)
        except (urllib.error.URLError, OSError, ValueError):
            report = None
        if report is not None:
            ours = [m for m in report["models"].values() if m["pool"] in pools]
            if ours and all(m["healthy_replicas"] > 0 for m in ours):
                return
        time.sleep(0.3)
    raise EngineError(f"the gateway at {url} was not ready after {timeout_s:.0f}s")


def _examples(base: str) -> str:
    return f"""
  Gateway ready: {base}/v1   (OPENAI_BASE_URL={base}/v1, any OPENAI_API_KEY)

  curl {base}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "tiny", "messages": [{{"role": "user", "content": "Hello"}}], "max_tokens": 16}}'

  python - <<'PY'
  from openai import OpenAI
  client = OpenAI(base_url="{base}/v1", api_key="unused")
  reply = client.chat.completions.create(
      model="tiny", messages=[{{"role": "user", "content": "Hello"}}], max_tokens=16)
  print(reply.choices[0].message.content, reply.usage)
  PY

  The tiny model has random weights: its text is noise, everything else is real vLLM.
  engine status  (.venv/bin/engine status) shows the replicas. Ctrl-C stops everything.
"""


def say(message: str, stream: TextIO | None = None) -> None:
    """Print a line. When its reader is gone, write nothing from then on, rather than
    raise BrokenPipeError in the middle of stopping the replicas."""
    stream = stream or sys.stdout
    try:
        print(message, file=stream, flush=True)
    except BrokenPipeError:
        # Python's recipe (docs: signal, "Note on SIGPIPE"): later writes and the flush at
        # exit go to /dev/null instead of raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def _ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _stop_gateway(gateway: subprocess.Popen[bytes], lifeline: Lifeline) -> None:
    """One SIGINT: uvicorn drains, then the gateway stops its embedded Redis. Whatever is
    left of its group after that (a Redis of a gateway that was killed) is stopped too."""
    if gateway.poll() is None:
        gateway.send_signal(signal.SIGINT)
        try:
            gateway.wait(timeout=GATEWAY_STOP_S)
        except subprocess.TimeoutExpired:
            gateway.kill()
            gateway.wait()
    stop_groups({gateway.pid})
    lifeline.release(gateway.pid)


def run_stack() -> int:
    paths = Paths.default()
    host = os.environ.get("GATEWAY_HOST", "127.0.0.1")
    port = os.environ.get("GATEWAY_PORT", "8080")
    chat = load_profile(os.environ.get("ENGINE_PROFILE", "cpu-tiny"))
    on_gpu = chat.device == "gpu"
    default_policy = ROOT / "policies" / ("gpu.yaml" if on_gpu else "default.yaml")
    policy = os.environ.get("GATEWAY_POLICY", str(default_policy))
    model_override = os.environ.get("ENGINE_MODEL") or None
    replicas = int(os.environ.get("ENGINE_REPLICAS", "1" if on_gpu else "2"))
    launches = [Launch(chat, replicas, resolve_model(chat, model_override, paths))]
    embed_name = os.environ.get("ENGINE_EMBED_PROFILE", "" if on_gpu else "cpu-tiny-embed")
    if embed_name:
        embed = load_profile(embed_name)
        launches.append(Launch(embed, 1, resolve_model(embed, model_override, paths)))

    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        _ignore_stop_signals()  # a second Ctrl-C must not cut the stopping short
        raise KeyboardInterrupt

    for signum in STOP_SIGNALS:
        signal.signal(signum, on_signal)
    lifeline = Lifeline.start()  # first: every process started after it dies with the stack
    gateway: subprocess.Popen[bytes] | None = None
    try:
        down(paths, say=lambda m: None)  # leftovers of an earlier run that was killed
        what = ", ".join(f"{launch.count} x {launch.profile.name}" for launch in launches)
        say(f"engine: starting {what} (1-2 minutes on 2 CPU cores)")
        up(launches, paths=paths, say=say, lifeline=lifeline)
        state_dir = (paths.run / "state").resolve()
        if not os.environ.get("REDIS_URL"):
            say(f"state: no REDIS_URL, the gateway runs an embedded durable Redis in {state_dir}")
        env = {
            **os.environ,
            "ENGINE_STATE": str(paths.state.resolve()),
            "GATEWAY_STATE_DIR": str(state_dir),
        }
        command = ["gateway", "serve", "--policy", policy, "--host", host, "--port", port]
        gateway = subprocess.Popen(
            [sys.executable, "-m", *command], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
            process_group=0,  # its own group: Ctrl-C reaches the stack only (see above)
        )  # fmt: skip
        lifeline.hold(gateway.pid)
        base = f"http://{host}:{port}"
        _wait_ready(base, gateway, {launch.pool or launch.profile.pool for launch in launches})
        say(_examples(base))
        # Replicas that die are stopped whole and started again (engine/watchdog.py).
        watchdog = ReplicaWatchdog(launches, paths, say=say, lifeline=lifeline)
        while gateway.poll() is None:
            watchdog.check()
            time.sleep(WATCH_INTERVAL_S)
        return 0 if stopping else (gateway.returncode or 0)
    except KeyboardInterrupt:
        say("\nstopping...")
        return 0
    except EngineError as exc:
        say(f"engine: {exc}", sys.stderr)
        return 1
    finally:
        _ignore_stop_signals()
        if gateway is not None:
            _stop_gateway(gateway, lifeline)
        down(paths, say=say, lifeline=lifeline)
        lifeline.close()
        say("engine: stopped")
