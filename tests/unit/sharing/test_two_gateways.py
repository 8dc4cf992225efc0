"""Two real `gateway serve` processes sharing routing through the test Redis, in front of
fake engines (tests/fault/fault_upstream.py).

- Requests with one long prefix alternate between the gateways and all land on one
  replica. The first gateway has already placed another prompt, so on its own view it
  would send the prefix elsewhere (that replica is loaded, the prefix unknown); it learns
  from the second gateway's placement instead.
- `max_inflight_per_replica` holds across both: with two requests running through the
  first gateway at the limit of 2, the second refuses a third with 429.
- Fair admission holds across both: a tenant holding the pool through the first gateway
  does not make another tenant's request through the second look alone (and be shed);
  it waits in line and is served when a slot frees.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.fault.harness import running_upstreams
from tests.integration.conftest import Gateway, running_gateway, until_applied
from tests.policies import with_redis

LONG = "You are a careful agent. " * 900  # about 22 KB: 40+ prefix blocks


def policy_text(pool: str, urls: list[str], max_inflight: int = 64) -> str:
    replicas = ", ".join(f'{{url: "{url}"}}' for url in urls)
    return f"""\
version: 1
server: {{reload_interval_s: 0}}
pools:
  {pool}: {{served_model: fault-main, replicas: [{replicas}]}}
models:
  main: {{pool: {pool}}}
routing:
  implicit_sessions: false
  shared_opening_conversations: 0
resilience:
  admission: {{max_inflight_per_replica: {max_inflight}, on_saturated: reject}}
"""


def pair(stack: ExitStack, policy: Path, tmp_path: Path) -> tuple[Gateway, Gateway]:
    first = stack.enter_context(running_gateway(policy, tmp_path / "gateway-1.log"))
    second = stack.enter_context(running_gateway(policy, tmp_path / "gateway-2.log"))
    return first, second


def ask(gateway: Gateway, system: str, user: str) -> httpx.Response:
    body = {
        "model": "main",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 5,
    }
    return httpx.post(f"{gateway.v1}/chat/completions", json=body, timeout=30)


@pytest.fixture
def pool() -> str:
    return f"p{uuid.uuid4().hex[:10]}"


def test_one_prefix_sent_through_two_gateways_lands_on_one_replica(
    redis_url: str, tmp_path: Path, pool: str
) -> None:
    with ExitStack() as stack, running_upstreams(["e1", "e2"], tmp_path) as engines:
        policy = tmp_path / "policy.yaml"
        policy.write_text(with_redis(policy_text(pool, [e.url for e in engines]), redis_url))
        first, second = pair(stack, policy, tmp_path)
        other = "An unrelated system prompt. " * 900
        assert ask(first, other, "warm up").status_code == 200
        until_applied(second, 1)
        gateways, learned = (first, second), [0, 1]  # placements each has applied
        replicas = []
        for turn in range(8):
            sender, receiver = (1, 0) if turn % 2 == 0 else (0, 1)  # the second starts
            answer = ask(gateways[sender], LONG, f"question {turn}")
            assert answer.status_code == 200
            replicas.append(answer.headers["x-gateway-replica"])
            learned[receiver] += 1
            until_applied(gateways[receiver], learned[receiver])
        assert len(set(replicas)) == 1, replicas


def test_the_inflight_limit_holds_across_two_gateways(
    redis_url: str, tmp_path: Path, pool: str
) -> None:
    with (
        ExitStack() as stack,
        running_upstreams(["slow"], tmp_path, tokens=5, token_delay_s=0.6) as (engine,),
    ):
        policy = tmp_path / "policy.yaml"
        policy.write_text(with_redis(policy_text(pool, [engine.url], max_inflight=2), redis_url))
        first, second = pair(stack, policy, tmp_path)

        async def scenario() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"model": "main", "messages": [{"role": "user", "content": "hi"}]}
                running = [
                    asyncio.create_task(client.post(f"{first.v1}/chat/completions", json=body))
                    for _ in range(2)
                ]
                await asyncio.sleep(0.5)  # both in flight (3 s each), and published
                third = await client.post(f"{second.v1}/chat/completions", json=body)
                return [third.status_code] + [(await r).status_code for r in running]

        third, *held = asyncio.run(scenario())
        assert held == [200, 200]
        assert third == 429
        assert ask(second, "s", "after").status_code == 200  # room again once they ended


def test_fair_admission_sees_a_tenant_flooding_through_the_other_gateway(
    redis_url: str, tmp_path: Path, pool: str
) -> None:
    keys = {"hog": "sk-agw-two-gateways-hog-1d9c", "quiet": "sk-agw-two-gateways-quiet-7e2a"}
    tenants = "".join(
        f"  {name}: {{keys: [{{sha256: {hashlib.sha256(key.encode()).hexdigest()}}}]}}\n"
        for name, key in keys.items()
    )
    with (
        ExitStack() as stack,
        running_upstreams(["slow"], tmp_path, tokens=5, token_delay_s=0.3) as (engine,),
    ):
        policy = tmp_path / "policy.yaml"
        text = policy_text(pool, [engine.url], max_inflight=2) + "tenants:\n" + tenants
        policy.write_text(with_redis(text, redis_url))
        first, second = pair(stack, policy, tmp_path)

        async def scenario() -> tuple[list[int], int]:
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"model": "main", "messages": [{"role": "user", "content": "hi"}]}

                def send(gateway: Gateway, tenant: str) -> asyncio.Task[httpx.Response]:
                    headers = {"Authorization": f"Bearer {keys[tenant]}"}
                    url = f"{gateway.v1}/chat/completions"
                    return asyncio.create_task(client.post(url, json=body, headers=headers))

                hogging = [send(first, "hog") for _ in range(2)]  # the pool's 2 slots
                await asyncio.sleep(0.5)  # in flight (1.5 s each), and published
                quiet = await send(second, "quiet")
                return [(await r).status_code for r in hogging], quiet.status_code

        held, quiet = asyncio.run(scenario())
        assert held == [200, 200]
        assert quiet == 200  # waited for a slot instead of a 429
