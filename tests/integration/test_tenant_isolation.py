"""Tenants and the engine's own prefix cache, on a real vLLM replica: an isolated tenant's
prompt is never served from another tenant's cached blocks (the engine's own
`cached_tokens` says so), while tenants that share a group do share them.

One replica, so that a miss is the engine keeping the tenants apart (its `cache_salt`),
never the router sending the second tenant elsewhere.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Engines, Gateway, running_gateway

pytestmark = pytest.mark.engine

KEYS = {name: f"sk-agw-isolation-{name}-{uuid.uuid4().hex}" for name in ("a", "b", "c", "d")}


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def tenants_gateway(
    engines: Engines, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    work: Path = tmp_path_factory.mktemp("isolation")
    replica = engines.urls("tiny-chat")[0]
    policy = work / "policy.yaml"
    policy.write_text(
        f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
pools: {{one: {{served_model: tiny, replicas: [{{url: "{replica}"}}]}}}}
models: {{tiny: {{pool: one}}}}
tenants:
  iso-a: {{keys: [{{sha256: {_digest(KEYS["a"])}}}]}}
  iso-b: {{keys: [{{sha256: {_digest(KEYS["b"])}}}]}}
  acme-c: {{prefix_cache_group: acme, keys: [{{sha256: {_digest(KEYS["c"])}}}]}}
  acme-d: {{prefix_cache_group: acme, keys: [{{sha256: {_digest(KEYS["d"])}}}]}}
"""
    )
    with running_gateway(policy, work / "gateway.log") as gateway:
        yield gateway


def _ask(gateway: Gateway, tenant: str, prompt: str) -> tuple[int, str]:
    """(cached prompt tokens the engine reports, X-Gateway-Route)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "go"}],
        "max_tokens": 1,
    }
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    response = httpx.post(f"{gateway.v1}/chat/completions", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    details = response.json()["usage"].get("prompt_tokens_details") or {}
    return details.get("cached_tokens") or 0, response.headers["x-gateway-route"]


def _prompt() -> str:
    # A text no other test sends, long enough for many of the engine's 32-token blocks.
    marker = uuid.uuid4().hex
    return f"Playbook {marker}: " + " ".join(f"step {i} of case {marker}" for i in range(120))


def test_an_isolated_tenant_never_hits_another_tenants_cached_prompt(
    tenants_gateway: Gateway,
) -> None:
    prompt = _prompt()
    _ask(tenants_gateway, "a", prompt)
    again, _ = _ask(tenants_gateway, "a", prompt)
    assert again > 0  # the engine caches the tenant's own prompt ...
    probe, route = _ask(tenants_gateway, "b", prompt)
    assert probe == 0  # ... and another tenant sending it finds nothing cached
    assert "cached_blocks=0/" in route


def test_tenants_of_one_group_share_the_engines_cache(tenants_gateway: Gateway) -> None:
    prompt = _prompt()
    _ask(tenants_gateway, "c", prompt)
    shared, route = _ask(tenants_gateway, "d", prompt)
    assert shared > 0
    assert "cached_blocks=0/" not in route
    outsider, _ = _ask(tenants_gateway, "a", prompt)
    assert outsider == 0
