"""Two real `gateway serve` processes in front of the same two real vLLM replicas, sharing
routing state through Redis (gateway/sharing/): a prefix one gateway placed is sent by the
other to the replica that holds it, and the engine's own `cached_tokens` says it was
served from that replica's prefix cache. Without sharing the second gateway could not know
where the prefix went (tests/unit/sharing/ prove the mechanism on fake engines; this is the
proof on vLLM).

Session affinity is off (`implicit_sessions: false`: with it both gateways would agree
through rendezvous hashing without sharing anything), and the second gateway first takes
one request of its own, so that on their own the two would choose differently. Each of
several fresh prefixes is then placed by one gateway and asked of the other: every one must
land where it was placed. (With `sharing.enabled: false` this test failed: checked on
2026-12-03.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Engines, Gateway, applied, running_gateway, until_applied

pytestmark = pytest.mark.engine

PREFIXES = 4


@pytest.fixture(scope="module")
def two_gateways(
    engines: Engines, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gateway, Gateway]]:
    work: Path = tmp_path_factory.mktemp("two-gateways")
    replicas = ", ".join(f'{{url: "{url}"}}' for url in engines.urls("tiny-chat"))
    pool = f"shared-{uuid.uuid4().hex[:8]}"  # a stream of its own in the shared Redis
    policy = work / "policy.yaml"
    policy.write_text(
        f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
pools: {{{pool}: {{served_model: tiny, replicas: [{replicas}]}}}}
models: {{tiny: {{pool: {pool}}}}}
routing: {{implicit_sessions: false, sharing: {{enabled: true}}}}
"""
    )
    with ExitStack() as stack:
        first = stack.enter_context(running_gateway(policy, work / "a.log"))
        second = stack.enter_context(running_gateway(policy, work / "b.log"))
        yield first, second


def _ask(gateway: Gateway, prompt: str) -> tuple[str, int]:
    """(the replica that answered, the prompt tokens its engine served from cache)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "go"}],
        "max_tokens": 1,
    }
    response = httpx.post(f"{gateway.v1}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    details = response.json()["usage"].get("prompt_tokens_details") or {}
    return response.headers["x-gateway-replica"], details.get("cached_tokens") or 0


def test_a_prefix_placed_by_one_gateway_is_routed_to_its_replica_by_the_other(
    two_gateways: tuple[Gateway, Gateway],
) -> None:
    first, second = two_gateways
    _ask(second, f"warm-up {uuid.uuid4().hex}")  # the two gateways' own views now differ
    placed: set[str] = set()
    known = applied(second)
    for _ in range(PREFIXES):
        marker = uuid.uuid4().hex
        prompt = f"Runbook {marker}: " + " ".join(f"step {i} of {marker}" for i in range(120))
        where, _ = _ask(first, prompt)
        placed.add(where)
        known += 1
        until_applied(second, known)  # the placement's flush (10 ms) and the other's read
        there, cached = _ask(second, prompt)
        assert there == where  # the other gateway knew where the prefix went ...
        assert cached > 0  # ... and the engine served it from its prefix cache
