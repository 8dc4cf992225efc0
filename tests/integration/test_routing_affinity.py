"""Cache-affinity routing on real vLLM replicas: an agent's turns stay on the replica that
holds its prefix, and the engine reports the cached tokens."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import SHARED_DATA
from tests.integration.conftest import Gateway

pytestmark = pytest.mark.engine

TAU = SHARED_DATA / "agent-trajectories" / "tau_bench_airline_dev.jsonl"


@pytest.fixture
def http(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.v1, timeout=120) as client:
        yield client


def tau_conversation(index: int) -> dict[str, object]:
    with TAU.open() as lines:
        for i, line in enumerate(lines):
            if i == index:
                record: dict[str, object] = json.loads(line)
                return record
    raise IndexError(index)


def test_agent_turns_follow_their_prefix_and_hit_the_engine_cache(http: httpx.Client) -> None:
    """Two tau-bench agents interleave their turns; each keeps its replica, and from the
    second turn on most of each prompt comes from the engine's prefix cache."""
    agents = [tau_conversation(0), tau_conversation(4)]
    replicas: dict[int, set[str]] = {0: set(), 1: set()}
    cached_share: dict[int, list[float]] = {0: [], 1: []}
    for turn in range(1, 5):
        for a, record in enumerate(agents):
            messages = record["messages"]
            assert isinstance(messages, list)
            assistant_turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
            history = messages[: assistant_turns[turn]]
            body = {
                "model": "tiny",
                "messages": history,
                "tools": record["tools"],
                "tool_choice": "none",
                "max_tokens": 1,
            }
            response = http.post("/chat/completions", json=body)
            assert response.status_code == 200, response.text
            replicas[a].add(response.headers["x-gateway-replica"])
            usage = response.json()["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            cached_share[a].append(cached / usage["prompt_tokens"])
            if turn > 1:
                assert response.headers["x-gateway-route"].startswith("prefix;")
    for a in (0, 1):
        assert len(replicas[a]) == 1, f"agent {a} was scattered over {replicas[a]}"
        assert min(cached_share[a][1:]) > 0.8, cached_share[a]


def test_session_prefix_change_is_reported_through_the_gateway(http: httpx.Client) -> None:
    record = tau_conversation(1)
    messages = record["messages"]
    tools = record["tools"]
    assert isinstance(messages, list) and isinstance(tools, list)
    headers = {"X-Session-Id": f"integration-{uuid.uuid4().hex}"}
    base = {"model": "tiny", "messages": messages[:2], "tool_choice": "none", "max_tokens": 1}
    first = http.post("/chat/completions", json={**base, "tools": tools}, headers=headers)
    reordered = http.post(
        "/chat/completions", json={**base, "tools": list(reversed(tools))}, headers=headers
    )
    fewer = http.post("/chat/completions", json={**base, "tools": tools[1:]}, headers=headers)
    assert first.status_code == reordered.status_code == fewer.status_code == 200
    assert "x-gateway-prefix-change" not in reordered.headers  # canonicalized: same prefix
    assert fewer.headers["x-gateway-prefix-change"] == "tools"
