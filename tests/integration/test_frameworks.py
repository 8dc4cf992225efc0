"""CrewAI and AutoGen pointed at the gateway, in front of real vLLM.

Both frameworks live in their own environment (tests/frameworks/env.sh; `make test` builds
it), so each run is `tests/frameworks/agents.py` in a subprocess; it prints what the
framework reported, and the gateway's own counters are read around it: every call the
framework made is one the gateway served.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.supervisor import ROOT
from tests.conftest import SHARED_DATA
from tests.integration.conftest import Gateway

pytestmark = pytest.mark.engine

PYTHON = ROOT / ".venv-frameworks" / "bin" / "python"
AGENTS = Path(__file__).resolve().parent.parent / "frameworks" / "agents.py"
TAU = SHARED_DATA / "agent-trajectories" / "tau_bench_airline_dev.jsonl"


def run_agents(framework: str, gateway: Gateway, *args: str) -> dict[str, Any]:
    if not PYTHON.exists():
        pytest.fail(f"no frameworks environment at {PYTHON}: run tests/frameworks/env.sh")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CREWAI_"))}
    done = subprocess.run(
        [str(PYTHON), str(AGENTS), framework, gateway.v1, *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def served_since(gateway: Gateway, before: float, expected: float) -> float:
    """How many more the gateway has served since `before`; waits a moment for `expected`,
    since a stream is counted as it ends, which can be just after the client has read it."""
    deadline = time.monotonic() + 5
    while (count := served(gateway) - before) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return count


def served(gateway: Gateway) -> float:
    """Chat completions of model `tiny` the gateway answered with 200."""
    with urllib.request.urlopen(f"{gateway.base_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gateway_requests"
        for sample in family.samples
        if sample.name == "gateway_requests_total"
        and sample.labels.get("model") == "tiny"
        and sample.labels.get("status") == "200"
    )


def airline_policy() -> str:
    """The system prompt of a real tau-bench airline agent (6 KB): what such a crew's
    agents carry, and long enough that holding it matters more to the router than the
    recent work other tests left on one replica."""
    with TAU.open() as lines:
        record = json.loads(next(lines))
    policy: str = record["messages"][0]["content"]
    return policy


def test_a_crewai_crew_runs_through_the_gateway(gateway: Gateway, tmp_path: Path) -> None:
    backstory = tmp_path / "backstory.txt"
    backstory.write_text(airline_policy(), encoding="utf-8")
    before = served(gateway)
    crew = run_agents("crewai", gateway, str(backstory))
    assert crew["provider"] == "OpenAICompletion"  # CrewAI's native OpenAI client, no litellm
    first, second = crew["runs"]
    for run in (first, second):
        assert len(run["outputs"]) == 2 and all(run["outputs"])
        assert run["usage"]["prompt_tokens"] > 0 and run["usage"]["completion_tokens"] > 0
    # One model call per task: neither answer carries a tool call, so each is final. (Not
    # CrewAI's `successful_requests`: it said 4 for 2 calls.)
    assert served_since(gateway, before, 4) == 4
    # The second kickoff's prompts open as the first's did, so the engine serves them from
    # its prefix cache, and CrewAI counts the cached tokens the gateway passed on. How many
    # varies: 8,832 of 8,970 in one run, 4,224 of 8,978 in a CI run. The router weighs a
    # 12-block prefix against the recent work earlier tests left on each replica, by
    # design; routing itself is proven in test_routing_affinity.py and the benchmarks.
    # Here: the plumbing.
    usage = second["usage"]
    assert usage["cached_prompt_tokens"] > 0


def test_an_autogen_assistant_streams_and_gets_a_forced_tool_call(gateway: Gateway) -> None:
    before = served(gateway)
    run = run_agents("autogen", gateway)
    assert run["messages"] == ["TextMessage", "TextMessage"]  # the task, then the reply
    assert run["reply"]
    assert run["reply_usage"]["completion_tokens"] > 0  # the stream's usage chunk arrived
    if run["forced_refused"] is not None:
        # vLLM 0.32 constrains a named call's name only: arguments the random weights made
        # that are no JSON object are refused by the gateway, never passed on.
        assert run["forced_refused"] == {"status": 502, "code": "invalid_tool_call"}
        assert served_since(gateway, before, 1) == 1  # the agent's one model call
        return
    # Parsed when the random-weight model finishes the constrained JSON, markup otherwise.
    if run["forced_calls"] is not None:
        assert run["forced_calls"] == ["lookup_booking"]
    else:
        assert re.match(r'<tool_call>\s*\{"name": "lookup_booking"', run["forced_text"])
    assert run["forced_usage"]["prompt_tokens"] > 0
    assert served_since(gateway, before, 2) == 2  # the agent's one model call, the forced one
