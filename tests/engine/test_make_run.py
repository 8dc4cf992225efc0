"""`make run`'s stack (`engine stack`): engines, embedded state store and the gateway come
up with the default policy, serve a real chat completion, replace a replica that crashed,
and all stop on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from engine.lifeline import Lifeline
from engine.supervisor import ROOT, free_port

pytestmark = pytest.mark.engine


def replicas(run_dir: Path) -> list[dict[str, Any]]:
    state: dict[str, list[dict[str, Any]]] = json.loads((run_dir / "engine-state.json").read_text())
    return state["replicas"]


def test_stack_serves_through_real_vllm_and_stops_on_ctrl_c(
    tmp_path: Path, engine_lifeline: Lifeline
) -> None:
    port = free_port()
    env = {**os.environ, "ENGINE_RUN_DIR": str(tmp_path), "GATEWAY_PORT": str(port)}
    for name in ("REDIS_URL", "ENGINE_STATE", "GATEWAY_POLICY"):
        env.pop(name, None)  # the defaults `make run` uses on a fresh machine
    log = tmp_path / "stack.log"
    with log.open("w") as out:
        # Its own process group, held by the suite's reaper: a killed pytest leaves no
        # stack behind.
        stack = subprocess.Popen(
            [sys.executable, "-m", "engine", "stack"], cwd=ROOT, env=env,
            stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
    engine_lifeline.hold(stack.pid)
    try:
        deadline = time.monotonic() + 900
        while "Gateway ready" not in log.read_text():
            assert stack.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(1)
        printed = log.read_text()
        base = f"http://127.0.0.1:{port}/v1"
        assert base in printed and "curl" in printed and "from openai import OpenAI" in printed
        assert "embedded durable Redis" in printed

        with OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
            reply = client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Hello"}],
                max_tokens=4,
                extra_body={"ignore_eos": True},
            )
            assert reply.usage is not None and reply.usage.completion_tokens == 4
            assert client.embeddings.create(model="tiny-embed", input="x").data
        pids = [r["pid"] for r in replicas(tmp_path)]
        assert len(pids) == 3

        # A chat replica's API server crashes: the watchdog stops what is left of it (vLLM's
        # engine core) and starts a replica in its place, which the gateway then uses.
        crashed = next(r["pid"] for r in replicas(tmp_path) if r["pool"] == "tiny-chat")
        os.kill(crashed, signal.SIGKILL)
        deadline = time.monotonic() + 600
        while crashed in (pids := [r["pid"] for r in replicas(tmp_path)]) or len(pids) < 3:
            assert stack.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(1)
        with pytest.raises(ProcessLookupError):
            os.killpg(crashed, 0)  # no process of the crashed replica is left
        assert f"(pid {crashed}) was killed by signal 9" in log.read_text()
        with OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
            for _ in range(4):  # round the pool: every replica in it answers
                assert client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
                ).choices
    finally:
        stack.send_signal(signal.SIGINT)
        code = stack.wait(timeout=120)
        engine_lifeline.release(stack.pid)
    assert code == 0, log.read_text()
    assert json.loads((tmp_path / "engine-state.json").read_text())["replicas"] == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert (tmp_path / "state" / "appendonlydir").exists()  # the embedded store persisted
