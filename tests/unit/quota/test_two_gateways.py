"""One tenant limit, two gateway processes, one Redis: the limit holds exactly.

Two real `gateway serve` processes share the test Redis, in front of one fake engine
process (tests/fault/fault_upstream.py: the claim here is about Redis and the limit, not
the engine). One tenant may make 10 requests a minute; 60 requests fired at once, half at
each gateway, after 4 taken at the first alone, get exactly 6 answers and 54 429s, each
with the rate-limit headers. A request comes back every 6 s, far longer than the bursts
take, so none refills during them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Gateway
from tests.unit.gateway_pair import Pair, gateway_pair

LIMIT = 10
FIRST_ALONE = 4
PER_GATEWAY = 30


@pytest.fixture
def tenant() -> tuple[str, str]:
    return f"pair-{uuid.uuid4().hex[:10]}", f"sk-agw-test-{uuid.uuid4().hex}"


@pytest.fixture
def pair(redis_url: str, tmp_path: Path, tenant: tuple[str, str]) -> Iterator[Pair]:
    name, key = tenant
    settings = f"rate_limits: {{requests_per_minute: {LIMIT}}}"
    with gateway_pair(redis_url, tmp_path, name, key, settings) as started:
        yield started


async def send(gateways: list[Gateway], key: str, per_gateway: int) -> list[httpx.Response]:
    """`per_gateway` requests at each gateway, all at once."""
    body = {"model": "main", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=per_gateway * len(gateways))
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(f"{gateway.v1}/chat/completions", json=body, headers=headers)
                for _ in range(per_gateway)
                for gateway in gateways
            )
        )


def test_two_gateways_admit_exactly_the_limit_between_them(
    pair: Pair, tenant: tuple[str, str]
) -> None:
    first, second = pair.gateways
    # The first gateway takes part of the limit alone; then both are hit at once: what the
    # second can admit depends on what the first took, so the count lives in Redis.
    early = asyncio.run(send([first], tenant[1], FIRST_ALONE))
    assert [a.status_code for a in early] == [200] * FIRST_ALONE
    answers = asyncio.run(send([first, second], tenant[1], PER_GATEWAY))

    admitted = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(admitted) == LIMIT - FIRST_ALONE
    assert len(refused) == 2 * PER_GATEWAY - len(admitted)
    # each admission saw the bucket one lower: no two read the same count
    left = sorted(int(a.headers["x-ratelimit-remaining-requests"]) for a in early + admitted)
    assert left == list(range(LIMIT))
    for answer in refused:
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert 1 <= int(answer.headers["retry-after"]) <= 6
        assert answer.headers["x-ratelimit-limit-requests"] == str(LIMIT)
        assert answer.headers["x-ratelimit-remaining-requests"] == "0"
        assert answer.headers["x-ratelimit-reset-requests"].endswith("s")
    both = {httpx.URL(gateway.base_url).port for gateway in (first, second)}
    assert {a.request.url.port for a in refused} == both
    assert pair.engine.stats()["completed"] == LIMIT  # the engine saw only what was admitted
