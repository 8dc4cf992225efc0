"""Two real `gateway serve` processes on the test Redis, in front of one fake engine process
(tests/fault/fault_upstream.py), serving one tenant whose settings a test chooses: for the
claims that hold across gateway processes (a rate limit, a storage cap)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.fault.harness import FaultUpstream, running_upstreams
from tests.integration.conftest import Gateway, running_gateway
from tests.policies import with_redis
from tests.unit.tenant_gateway import forget_tenants


@dataclass(frozen=True)
class Pair:
    gateways: tuple[Gateway, Gateway]
    engine: FaultUpstream


@contextmanager
def gateway_pair(
    redis_url: str, work: Path, tenant: str, key: str, settings: str
) -> Iterator[Pair]:
    """`settings`: the tenant's policy entry beside its key, as YAML at its indent (e.g.
    `rate_limits: {requests_per_minute: 10}`). The model is `main`; what the tenant left in
    Redis is deleted after."""
    with ExitStack() as stack, running_upstreams(["engine"], work) as (engine,):
        policy = work / "policy.yaml"
        policy.write_text(with_redis(f"""\
version: 1
server: {{reload_interval_s: 0}}
pools:
  main: {{served_model: fault-main, replicas: [{{url: "{engine.url}"}}]}}
models:
  main: {{pool: main}}
tenants:
  {tenant}:
    keys: [{{sha256: {hashlib.sha256(key.encode()).hexdigest()}}}]
    {settings}
""", redis_url))  # fmt: skip
        stack.callback(forget_tenants, redis_url, tenant)
        first = stack.enter_context(running_gateway(policy, work / "gateway-1.log"))
        second = stack.enter_context(running_gateway(policy, work / "gateway-2.log"))
        yield Pair((first, second), engine)
