"""The policies the benchmarks write for the gateway are valid policies.

A benchmark runs outside `make test`; when the policy schema moves on (a key renamed or
moved), its gateway would exit at start-up and the benchmark fail long after the change.
Each benchmark's policy is built here the way the benchmark builds it and loaded with the
loader `gateway serve` uses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.loader import parse_policy
from tests.bench import tau_routing, telemetry_overhead
from tests.bench.overhead import targets as overhead_targets

REDIS = "redis://127.0.0.1:6379/0"
SINK = "http://127.0.0.1:4318/v1/traces"
ENGINE = "http://127.0.0.1:8001"


@pytest.mark.parametrize(
    "target",
    [
        *tau_routing.TARGETS,
        tau_routing.UNCANONICALISED,
        *tau_routing.TENANTS,
        *tau_routing.SCALE_OUT,
    ],
    ids=lambda t: t.name,
)
def test_tau_routing_policies_load(target: tau_routing.Target, tmp_path: Path) -> None:
    workers = [ENGINE, "http://127.0.0.1:8002"][: target.replicas]
    text = tau_routing.gateway_policy(target, workers, tmp_path / "state", tmp_path / "log.jsonl")
    policy = parse_policy(text, source="tau_routing")
    assert policy.routing.strategy == target.strategy
    assert policy.telemetry.request_log == str(tmp_path / "log.jsonl")
    assert [r.url for r in policy.pools["tiny"].replicas] == workers


def test_overhead_bench_policy_loads() -> None:
    policy = parse_policy(overhead_targets.gateway_policy(ENGINE, SINK, REDIS), source="overhead")
    assert policy.telemetry.traces.sample_ratio == 0.1


def test_overhead_bench_policy_takes_the_sharing_under_test() -> None:
    # `--sharing`: what sharing costs is measured with it off, or with another interval.
    off = overhead_targets.gateway_policy(ENGINE, SINK, REDIS, "{enabled: false}")
    assert parse_policy(off, source="overhead").routing.sharing.enabled is False
    slower = overhead_targets.gateway_policy(ENGINE, SINK, REDIS, "{flush_ms: 30}")
    assert parse_policy(slower, source="overhead").routing.sharing.flush_ms == 30


@pytest.mark.parametrize("ratio", list(telemetry_overhead.SETTINGS.values()))
def test_telemetry_bench_policies_load(ratio: float | None, tmp_path: Path) -> None:
    text = telemetry_overhead.policy_text(ENGINE, REDIS, SINK, ratio, tmp_path / "log.jsonl")
    parse_policy(text, source="telemetry_overhead")
