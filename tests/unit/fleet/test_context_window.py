"""The engines' context windows: read from each replica's `/v1/models` (vLLM's
`max_model_len`) once per time it comes up, and the smallest a route can reach given to
trimming budgets that set none."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.fleet.health import HealthMonitor, context_window
from gateway.fleet.replicas import Fleet
from gateway.policy import parse_policy
from gateway.policy.schema import HealthSpec
from tests.fault.fault_upstream import FaultEngine
from tests.unit.tiering.test_chooser import POLICY

VLLM_LISTING = {  # the shape vLLM 0.32's /v1/models answers
    "object": "list",
    "data": [{"id": "tiny", "object": "model", "owned_by": "vllm", "root": "/models/tiny",
              "parent": None, "max_model_len": 16384, "permission": []}],
}  # fmt: skip


@pytest.mark.parametrize(
    ("listing", "served", "expected"),
    [
        (VLLM_LISTING, "tiny", 16384),
        (VLLM_LISTING, "another-name", 16384),  # its only model
        ({"data": [{"id": "a", "max_model_len": 4096}, {"id": "b", "max_model_len": 8192}]},
         "b", 8192),
        ({"data": [{"id": "a", "max_model_len": 4096}, {"id": "b", "max_model_len": 8192}]},
         "c", None),  # several, none of them ours: no guess
        ({"data": [{"id": "tiny"}]}, "tiny", None),  # not vLLM: says none
        ({"data": [{"id": "tiny", "max_model_len": "16384"}]}, "tiny", None),
        ({"data": [{"id": "tiny", "max_model_len": True}]}, "tiny", None),
        ({"data": [{"id": "tiny", "max_model_len": -1}]}, "tiny", None),
        ({"data": "nope"}, "tiny", None),
        ([1, 2], "tiny", None),
        (None, "tiny", None),
    ],
)  # fmt: skip
def test_the_context_window_is_read_from_a_model_listing(
    listing: Any, served: str, expected: int | None
) -> None:
    assert context_window(listing, served) == expected


async def monitored(
    engine: FaultEngine,
) -> tuple[TestServer, Fleet, HealthMonitor, aiohttp.ClientSession]:
    server = TestServer(engine.app())
    await server.start_server()
    policy = parse_policy(
        "version: 1\npools:\n  tiny:\n    served_model: tiny\n"
        f"    replicas: [{{url: 'http://127.0.0.1:{server.port}'}}]\n"
        "models:\n  tiny: {pool: tiny}\n"
    )
    fleet = Fleet(policy)
    session = aiohttp.ClientSession()
    return server, fleet, HealthMonitor(fleet, session, HealthSpec()), session


async def test_the_monitor_reads_the_window_once_per_time_a_replica_comes_up() -> None:
    engine = FaultEngine("tiny", 5, 0.0, max_model_len=16384)
    server, fleet, monitor, session = await monitored(engine)
    try:
        replica = fleet.all_replicas()[0]
        await monitor.check_all(first=True)
        await monitor.check_all()
        await monitor.check_all()
        assert replica.context_tokens == 16384
        assert engine.models_listed == 1  # not on every poll
        assert fleet.pools["tiny"].context_tokens() == 16384
        # The engine restarts with a smaller context: read again once it is back.
        replica.healthy = False
        engine.max_model_len = 8192
        await monitor.check_all()
        assert replica.healthy and replica.context_tokens == 8192 and engine.models_listed == 2
    finally:
        await session.close()
        await server.close()


async def test_an_engine_that_reports_no_window_is_not_asked_on_every_poll() -> None:
    engine = FaultEngine("tiny", 5, 0.0)
    server, fleet, monitor, session = await monitored(engine)
    try:
        for _ in range(3):
            await monitor.check_all()
        assert fleet.all_replicas()[0].context_tokens is None
        assert fleet.pools["tiny"].context_tokens() is None
        assert engine.models_listed == 1
    finally:
        await session.close()
        await server.close()


def test_a_route_gets_the_smallest_window_of_the_engines_it_may_use() -> None:
    fleet = Fleet(parse_policy(POLICY))
    assert fleet.context_tokens("auto") is None  # none reported yet
    fleet.pools["s"].replicas[0].context_tokens = 8192
    fleet.pools["l"].replicas[0].context_tokens = 32768
    assert fleet.context_tokens("auto") == 8192  # either tier may serve it
    assert fleet.context_tokens("small") == 8192
    assert fleet.context_tokens("embed") is None
    assert fleet.context_tokens("no-such-model") is None
