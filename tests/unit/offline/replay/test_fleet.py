"""`replay_fleet`: K gateway routers behind a balancer, with and without shared placements."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.cli import main as gateway_main
from gateway.fleet.replicas import Replica
from gateway.offline.replay.fleet import (
    FleetConfig,
    Gateway,
    InflightBoard,
    Placement,
    PlacementBus,
    apply_placement,
    balancer,
    parse_counts,
    parse_sharings,
    placement_of,
    pool_of,
)
from gateway.offline.replay.run import ReplayConfig, TraceClock, replay, replay_fleet
from gateway.offline.replay.traces import TraceRequest
from gateway.policy.routing import RoutingSpec
from gateway.routing.build import build_router
from gateway.routing.costs import RouteRequest
from gateway.routing.router import ReplicaChoice, Router

CONFIG = ReplayConfig(replicas=4, cache_blocks=40)
SPEC = RoutingSpec(index_blocks_per_replica=CONFIG.cache_blocks)


def conversations(seed: int = 7, requests: int = 240) -> list[TraceRequest]:
    """Agent-like traffic: 12 conversations under 3 system prompts, each turn resending
    its history plus a few new blocks; small caches, so replicas evict."""
    rng = random.Random(seed)
    histories = [[1000 * (c % 3) + b for b in range(4)] for c in range(12)]
    next_block = 10_000
    trace = []
    for n in range(requests):
        history = histories[rng.randrange(len(histories))]
        for _ in range(rng.randint(1, 3)):
            history.append(next_block)
            next_block += 1
        if len(history) > 30:  # the conversation ends; a new one opens on its prompt
            del history[4:]
        trace.append(TraceRequest(n * 0.02, tuple(history), len(history) * 512, 20))
    return trace


def make_router(clock: TraceClock) -> Router:
    return build_router(SPEC, clock)


@pytest.mark.parametrize("sharing", ["none", "placements"])
@pytest.mark.parametrize("balance", ["random", "round_robin"])
def test_one_gateway_is_todays_replay_exactly(sharing: str, balance: str) -> None:
    trace = conversations()
    today = replay(trace, make_router, CONFIG)
    fleet = FleetConfig(1, balance, sharing, batch_s=0.005, lag_s=0.003)  # type: ignore[arg-type]
    one = replay_fleet(trace, make_router, CONFIG, fleet)
    assert (one.tally.hit_blocks, one.tally.total_blocks) == (today.hit_blocks, today.total_blocks)
    assert one.tally.ttfts == today.ttfts
    assert one.tally.work == today.work
    assert one.placements_applied == 0


def test_the_same_seed_replays_the_same_run() -> None:
    trace = conversations()
    fleet = FleetConfig(4, "random", "placements", batch_s=0.005, lag_s=0.03, seed=3)
    first = replay_fleet(trace, make_router, CONFIG, fleet)
    again = replay_fleet(trace, make_router, CONFIG, fleet)
    assert first.tally.ttfts == again.tally.ttfts
    assert first.tally.work == again.tally.work
    assert first.belief_gap_blocks == again.belief_gap_blocks


def test_seeds_change_which_gateway_takes_a_request() -> None:
    picks = {
        seed: [pick() for pick in [balancer(FleetConfig(4, seed=seed))] for _ in range(50)]
        for seed in (1, 2)
    }
    assert picks[1] != picks[2]
    assert set(picks[1]) == {0, 1, 2, 3}


def test_round_robin_balancer_takes_turns() -> None:
    pick = balancer(FleetConfig(3, "round_robin"))
    assert [pick() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_with_instant_placements_every_gateway_knows_what_each_replica_holds() -> None:
    # The gateway's index is sized like the engine's cache, so one gateway's belief of the
    # replica it picks is exact; placements applied before the next request keep that
    # true for K gateways, and without them each gateway's belief drifts.
    trace = conversations()
    shared = replay_fleet(trace, make_router, CONFIG, FleetConfig(4, sharing="placements"))
    alone = replay_fleet(trace, make_router, CONFIG, FleetConfig(4, sharing="none"))
    assert replay_fleet(trace, make_router, CONFIG, FleetConfig(1)).belief_gap_blocks == 0
    assert shared.belief_gap_blocks == 0
    assert shared.placements_applied == len(trace) - 1  # the last has no one to reach
    assert alone.belief_gap_blocks > 0
    assert alone.placements_applied == 0
    assert shared.tally.hit_rate > alone.tally.hit_rate


def test_placements_that_never_arrive_are_no_sharing() -> None:
    trace = conversations()
    never = FleetConfig(4, sharing="placements", lag_s=10 * trace[-1].at_s)
    late = replay_fleet(trace, make_router, CONFIG, never)
    alone = replay_fleet(trace, make_router, CONFIG, FleetConfig(4, sharing="none"))
    assert late.placements_applied == 0
    assert late.tally.ttfts == alone.tally.ttfts
    assert late.tally.work == alone.tally.work


class Recorder:
    """A router that only records the placements it learns."""

    def __init__(self) -> None:
        self.told: list[tuple[str, tuple[int, ...], float, int | None, float]] = []
        self.clock = TraceClock()

    def choose(
        self, replicas: Sequence[Replica], request: RouteRequest, exclude: frozenset[Replica]
    ) -> ReplicaChoice | None:
        return None

    def dispatched(self, decision: ReplicaChoice, request: RouteRequest) -> None:
        pass

    def learn(
        self, replica_id: str, blocks: Sequence[int], work: float, session: int | None = None
    ) -> None:
        self.told.append((replica_id, tuple(blocks), work, session, self.clock.now))

    def forget(self, replica_id: str, keep_since: float | None = None) -> None:
        pass

    def cached_share(self, replicas: Sequence[Replica], request: RouteRequest) -> float:
        return 0.0


def test_a_placement_reaches_the_others_after_the_flush_and_the_lag() -> None:
    routers = [Recorder() for _ in range(3)]
    gateways = [Gateway(r, pool_of(2), [[], []]) for r in routers]
    bus = PlacementBus(FleetConfig(3, sharing="placements", batch_s=0.005, lag_s=0.003))
    replica = gateways[1].pool[0].id
    bus.publish(0.012, Placement(origin=1, replica=replica, blocks=(5, 6), work=2.0, session=9))

    def set_clock(at: float) -> None:
        for router in routers:
            router.clock.now = at

    bus.deliver_until(0.0179, gateways, set_clock)  # flushed at 0.015, applied at 0.018
    assert all(not r.told for r in routers)
    bus.deliver_until(0.5, gateways, set_clock)
    assert routers[1].told == []  # the origin recorded it when it dispatched
    for receiver in (routers[0], routers[2]):
        ((rid, blocks, work, session, at),) = receiver.told
        assert (rid, blocks, work, session) == (replica, (5, 6), 2.0, 9)
        assert at == pytest.approx(0.018)


def test_an_applied_placement_is_what_the_receiving_router_then_believes() -> None:
    clock = TraceClock()
    router = build_router(SPEC, clock)
    pool = pool_of(2)
    request = RouteRequest((1, 2, 3), session="s")
    assert router.cached_share(pool, request) == 0.0
    apply_placement(router, Placement(0, pool[1].id, request.blocks, 4.0))
    assert router.cached_share(pool, request) == 1.0
    decision = router.choose(pool, request, frozenset())
    assert decision is not None and decision.replica is pool[1]


def test_a_conversation_moved_by_one_gateway_is_followed_by_the_others() -> None:
    """Session homes travel with placements: once load moved a conversation on one
    gateway, another gateway sends its next turn to the new home, not back to the
    rendezvous winner whose copy of its history is stale."""
    clock = TraceClock()
    pool = pool_of(3)
    sender, other = build_router(SPEC, clock), build_router(SPEC, clock)
    request = RouteRequest((), session="conversation-1")
    first = other.choose(pool, request, frozenset())
    assert first is not None and first.reason == "session"
    moved_to = next(r for r in pool if r is not first.replica)
    decision = ReplicaChoice(moved_to, "load", 0, 0)
    sender.dispatched(decision, request)
    apply_placement(other, placement_of(0, decision, request))
    followed = other.choose(pool, request, frozenset())
    assert followed is not None and followed.replica is moved_to


def test_gateway_counts_and_sharings_are_parsed() -> None:
    assert parse_counts("1,2,4,8") == (1, 2, 4, 8)
    assert parse_sharings("placements,none") == ("none", "placements")
    with pytest.raises(ValueError, match="--gateways"):
        parse_counts("1,x")
    with pytest.raises(ValueError, match="--sharing"):
        parse_sharings("gossip")


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    rows = [
        {
            "timestamp": request.at_s * 1000,
            "input_length": request.input_tokens,
            "output_length": request.output_tokens,
            "hash_ids": list(request.blocks),
        }
        for request in conversations()
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_replay_command_reports_each_gateway_count_and_sharing(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", "--trace", str(trace_file), "--replicas", "4", "--cache-blocks", "40"]
    fleet = ["--gateways", "1,4", "--sharing", "none,placements", "--lag-ms", "0"]
    assert gateway_main([*argv, *fleet, "--batch-ms", "0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {(row["gateways"], row["sharing"]): row for row in result["runs"]}
    assert set(rows) == {(1, "-"), (4, "none"), (4, "placements")}
    assert rows[(1, "-")]["hit_rate_over_one_gateway"] == 1.0
    assert rows[(4, "placements")]["belief_error"] == 0.0
    assert rows[(4, "none")]["hit_rate"] < rows[(4, "placements")]["hit_rate"]
    assert result["checks"]["gateways"] == 4
    assert gateway_main([*argv, *fleet]) == 0
    table = capsys.readouterr().out
    assert "placements" in table and "round-robin" in table


def test_replay_command_rejects_an_unknown_sharing(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", "--trace", str(trace_file), "--gateways", "2", "--sharing", "gossip"]
    assert gateway_main(argv) == 2
    assert "--sharing" in capsys.readouterr().err


def test_a_gateway_sees_the_others_in_flight_as_of_the_flush_before_its_last_read() -> None:
    board = InflightBoard(FleetConfig(3, sharing="placements", batch_s=0.01, lag_s=0.006))
    board.add(origin=0, replica="a", start=0.101, end=0.5)
    board.add(origin=1, replica="a", start=0.101, end=0.5)
    board.add(origin=1, replica="b", start=0.0, end=0.15)
    # At 0.115 the last read (0.11) saw the counts written at 0.10 (0.006 s on): none of
    # the requests sent at 0.101 yet.
    assert board.seen_by(2, 0.115)("a") == 0
    assert board.seen_by(2, 0.115)("b") == 1
    seen = board.seen_by(2, 0.13)  # written at 0.11, read at 0.12
    assert (seen("a"), seen("b")) == (2, 1)
    assert board.seen_by(0, 0.13)("a") == 1  # never its own
    assert board.seen_by(2, 0.3)("b") == 0  # ended at 0.15


def test_without_sharing_no_gateway_sees_the_others_in_flight() -> None:
    board = InflightBoard(FleetConfig(3, sharing="none"))
    board.add(origin=0, replica="a", start=0.0, end=1.0)
    assert board.seen_by(1, 0.5)("a") == 0
