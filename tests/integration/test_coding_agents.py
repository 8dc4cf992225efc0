"""The coding agents people run, unchanged, through the gateway to real vLLM: Claude Code
(`claude -p`, npm `@anthropic-ai/claude-code`, pinned in tests/clients/package.json and
installed by tests/clients/env.sh, which `make test` runs). Each test runs one
non-interactive turn against a gateway in front of the `cpu-tiny` replicas and checks that
the agent exited 0, that the gateway answered every request the agent made (its request
log: every status 200), and that the turn was kept as a session checkpoint.

The tiny model's text is noise (random weights), so the agent's answer is not checked; what
is checked is that the agent's own client accepted every answer the gateway gave it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.supervisor import ROOT
from tests.integration.conftest import Engines, Gateway, running_gateway

pytestmark = pytest.mark.engine

BIN = ROOT / ".clients" / "node_modules" / ".bin"


@pytest.fixture(scope="module")
def agents_gateway(
    engines: Engines, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A gateway that keeps the sessions the agents name themselves (`client`)."""
    if not (BIN / "claude").exists():
        pytest.fail(f"no coding agents at {BIN}: run tests/clients/env.sh (make test does)")
    work = tmp_path_factory.mktemp("agents")
    policy = work / "policy.yaml"
    policy.write_text(
        f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
sessions: {{key_from: [header, client]}}
telemetry: {{request_log: "{work}/requests.jsonl"}}
pools:
  tiny-chat: {{served_model: tiny, engine_state: {engines.state_file}}}
models:
  # The tiny model's random weights never choose to end a turn, and Claude Code takes an
  # answer cut at max_tokens for an error: a stop string ends its turns instead.
  tiny: {{pool: tiny-chat, defaults: {{stop: ["\\n"]}}}}
"""
    )
    with running_gateway(policy, work / "gateway.log") as gateway:
        yield gateway


def requests_served(gateway: Gateway) -> list[dict[str, Any]]:
    log = gateway.policy.parent / "requests.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def run_agent(
    command: list[str], env: dict[str, str], home: Path
) -> subprocess.CompletedProcess[str]:
    """One turn of a coding agent, with a home of its own and nothing sent elsewhere."""
    home.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_"))}
    return subprocess.run(
        command,
        cwd=home,
        env={**clean, "HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_claude_code_completes_a_turn(agents_gateway: Gateway, tmp_path: Path) -> None:
    done = run_agent(
        # Claude Code's own file and shell tools; its whole default set (48 KB of prompt)
        # is more than the tiny engine's 16,384-token context
        [
            str(BIN / "claude"),
            "-p",
            "Say hi.",
            "--model",
            "tiny",
            "--tools",
            "Bash,Read,Edit,Write,Glob,Grep",
        ],
        {
            "ANTHROPIC_BASE_URL": agents_gateway.base_url,
            "ANTHROPIC_AUTH_TOKEN": "unused",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            # No CLAUDE_CODE_MAX_OUTPUT_TOKENS: Claude Code asks for 32,000 tokens out, more
            # than the tiny engine's whole context (16,384), which vLLM would refuse; the
            # gateway sends the window. The stop string ends the turn long before: 47 of the
            # tiny vocabulary's 4,105 tokens hold a newline.
        },
        tmp_path / "claude-home",
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    served = requests_served(agents_gateway)
    messages = [r for r in served if r["operation"] == "messages"]
    assert messages, served
    assert all(r["status"] == 200 for r in served), served
    sessions = {r["session"] for r in messages}
    (session,) = sessions
    assert session.startswith("claude:")
    checkpoints = httpx.get(f"{agents_gateway.v1}/sessions/{session}/checkpoints", timeout=10)
    assert checkpoints.status_code == 200, checkpoints.text
    assert checkpoints.json()["data"], checkpoints.json()


def test_codex_cli_completes_a_turn(agents_gateway: Gateway, tmp_path: Path) -> None:
    """`codex exec` with the gateway as a custom Responses provider. Codex sends function
    and `namespace` tools, the hosted `web_search`, `reasoning`, `include`, `store: false`
    and its session in `prompt_cache_key`."""
    home = tmp_path / "codex-home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(
        f"""\
model = "tiny"
model_provider = "gateway"
[model_providers.gateway]
name = "agent gateway"
base_url = "{agents_gateway.v1}"
wire_api = "responses"
env_key = "GATEWAY_KEY"
"""
    )
    done = run_agent(
        [str(BIN / "codex"), "exec", "--skip-git-repo-check", "Say hi."],
        {"CODEX_HOME": str(home / ".codex"), "GATEWAY_KEY": "unused"},
        home,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    served = [r for r in requests_served(agents_gateway) if r["operation"] == "responses"]
    assert served
    assert all(r["status"] == 200 for r in requests_served(agents_gateway))
    (session,) = {r["session"] for r in served}  # its prompt_cache_key: one conversation
    checkpoints = httpx.get(f"{agents_gateway.v1}/sessions/{session}/checkpoints", timeout=10)
    assert checkpoints.status_code == 200, checkpoints.text
    assert checkpoints.json()["data"], checkpoints.json()
