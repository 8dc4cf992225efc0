"""`make run`'s stack (`engine stack`): engines, embedded state store and the gateway come
up with the default policy, serve a real chat completion, and all stop on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openai import OpenAI

from engine.supervisor import ROOT, free_port

pytestmark = pytest.mark.engine


def test_stack_serves_through_real_vllm_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "ENGINE_RUN_DIR": str(tmp_path), "GATEWAY_PORT": str(port)}
    for name in ("REDIS_URL", "ENGINE_STATE", "GATEWAY_POLICY"):
        env.pop(name, None)  # the defaults `make run` uses on a fresh machine
    log = tmp_path / "stack.log"
    with log.open("w") as out:
        stack = subprocess.Popen(
            [sys.executable, "-m", "engine", "stack"], cwd=ROOT, env=env,
            stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
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
        pids = [
            r["pid"] for r in json.loads((tmp_path / "engine-state.json").read_text())["replicas"]
        ]
        assert len(pids) == 3
    finally:
        stack.send_signal(signal.SIGINT)
        code = stack.wait(timeout=120)
    assert code == 0, log.read_text()
    assert json.loads((tmp_path / "engine-state.json").read_text())["replicas"] == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert (tmp_path / "state" / "appendonlydir").exists()  # the embedded store persisted
