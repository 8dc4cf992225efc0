"""The fault suite's stack, all real processes on loopback: three fault upstreams (two
replicas of pool `main`, one of pool `spare`, the fallback) started once, and a fresh
`gateway serve` in front of them for every test, so that no breaker state, replica health
or metric carries from one test to the next. Every upstream is reset before each test.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fault.harness import FaultUpstream, gateway_policy, metric, running_upstreams
from tests.integration.conftest import Gateway, running_gateway


@dataclass(frozen=True)
class Upstreams:
    a: FaultUpstream
    b: FaultUpstream
    spare: FaultUpstream

    @property
    def main(self) -> tuple[FaultUpstream, FaultUpstream]:
        return self.a, self.b

    def all(self) -> tuple[FaultUpstream, ...]:
        return self.a, self.b, self.spare


@dataclass(frozen=True)
class Stack:
    gateway: Gateway
    upstreams: Upstreams

    @property
    def v1(self) -> str:
        return self.gateway.v1

    def metrics(self) -> str:
        return httpx.get(f"{self.gateway.base_url}/metrics", timeout=5).text

    def metric(self, name: str, **labels: str) -> float:
        return metric(self.metrics(), name, **labels)


@pytest.fixture(scope="session")
def fault_upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    logs = tmp_path_factory.mktemp("fault-upstreams")
    with running_upstreams(["a", "b", "spare"], logs) as (a, b, spare):
        yield Upstreams(a, b, spare)


@pytest.fixture
def stack(fault_upstreams: Upstreams, redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    for upstream in fault_upstreams.all():
        upstream.reset()
    policy = tmp_path / "policy.yaml"
    policy.write_text(gateway_policy(list(fault_upstreams.main), fault_upstreams.spare, redis_url))
    try:
        with running_gateway(policy, tmp_path / "gateway.log") as gateway:
            yield Stack(gateway, fault_upstreams)
    finally:
        # A hung or stalled answer must not outlive its test.
        for upstream in fault_upstreams.all():
            upstream.fault("ok")
