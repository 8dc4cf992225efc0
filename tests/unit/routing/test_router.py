"""The cache-aware router: prefix affinity, bounded by load, sessions, explanations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.fleet.engine_chains import Held
from gateway.fleet.engine_metrics import EngineLoad
from gateway.fleet.replicas import Replica
from gateway.routing.costs import RouteRequest
from gateway.routing.index import PrefixIndex
from gateway.routing.load import LoadTracker
from gateway.routing.router import (
    CacheAwareRouter,
    CacheAwareSettings,
    ReplicaChoice,
    RoundRobinRouter,
    rendezvous,
)

WEIGHTS = {"prefix": 1.0, "load": 1.0, "queue": 0.25, "session": 8.0}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replicas(n: int) -> list[Replica]:
    return [Replica("pool", f"http://127.0.0.1:{9000 + i}", "m") for i in range(n)]


def router(
    clock: Clock | None = None, loads: dict[str, EngineLoad] | None = None, **settings: Any
) -> CacheAwareRouter:
    return CacheAwareRouter(
        CacheAwareSettings(weights=WEIGHTS, **settings),
        PrefixIndex(1000),
        LoadTracker(15.0, clock or Clock()),
        loads,
    )


def send(r: CacheAwareRouter, pool: list[Replica], request: RouteRequest) -> Replica:
    decision = r.choose(pool, request)
    assert decision is not None
    r.dispatched(decision, request)
    return decision.replica


def test_a_repeated_prefix_returns_to_the_replica_that_holds_it() -> None:
    pool = replicas(4)
    r = router()
    first = send(r, pool, RouteRequest(tuple(range(40))))
    send(r, pool, RouteRequest(tuple(range(100, 110))))  # unrelated traffic elsewhere
    decision = r.choose(pool, RouteRequest((*range(40), 77)))
    assert decision is not None
    assert decision.replica is first
    assert decision.reason == "prefix"
    assert decision.header() == "prefix; cached_blocks=40/41"


def test_new_prefixes_spread_over_idle_replicas() -> None:
    pool = replicas(4)
    r = router()
    chosen = {send(r, pool, RouteRequest(tuple(range(i * 100, i * 100 + 20)))) for i in range(4)}
    assert len(chosen) == 4


def test_a_hot_prefix_does_not_pile_onto_one_replica() -> None:
    pool = replicas(4)
    r = router(max_load_factor=2.0, load_slack_blocks=16)
    shared = tuple(range(30))
    counts: dict[Replica, int] = {}
    for i in range(40):  # everyone sends the same long prefix plus a little of their own
        replica = send(r, pool, RouteRequest((*shared, 1000 + i)))
        counts[replica] = counts.get(replica, 0) + 1
    assert len(counts) >= 2, "a shared prefix alone must not decide the replica"
    assert max(counts.values()) < 40


def test_a_shared_first_block_alone_does_not_decide() -> None:
    pool = replicas(2)
    r = router()
    first = send(r, pool, RouteRequest((1, *range(10, 40))))
    # Same first block, different conversation: costs differ by one block only, load decides.
    second = send(r, pool, RouteRequest((1, *range(50, 80))))
    assert second is not first


def test_a_long_uncached_prompt_goes_where_it_leaves_the_least_work() -> None:
    """Recent work below the tolerated mean costs nothing on its own, but a prompt no
    replica holds adds its whole prefill wherever it goes: priced after it is added, the
    least busy replica takes it rather than whichever rotation or queues would pick."""
    pool = replicas(4)
    r = router()
    for replica, work in zip(pool, (10.0, 10.0, 12.0, 0.0), strict=True):
        r.learn(replica.id, (), work)  # recent work all within the tolerated mean but one
    pool[3].inflight = 1  # the idle replica has one decoding request: its queue costs more
    decision = r.choose(pool, RouteRequest(tuple(range(1000, 1030))))
    assert decision is not None
    assert decision.replica is pool[3]
    assert decision.reason == "load"


def test_recent_work_decays() -> None:
    clock = Clock()
    pool = replicas(2)
    r = router(clock)
    a = send(r, pool, RouteRequest(tuple(range(200))))
    clock.now = 1000.0  # long after: a's old work no longer counts against it
    b = send(r, pool, RouteRequest(tuple(range(500, 700))))
    assert b is not a or clock.now > 0


def test_session_stays_on_its_replica_and_new_sessions_hash_consistently() -> None:
    pool = replicas(4)
    r1, r2 = router(), router()
    # Two gateways that never talked choose the same home for a new session.
    assert send(r1, pool, RouteRequest((), "sess-42")) is send(
        r2, pool, RouteRequest((), "sess-42")
    )
    home = rendezvous("sess-42", pool)
    decision = r1.choose(pool, RouteRequest((), "sess-42"))
    assert decision is not None
    assert decision.replica is home
    assert decision.reason == "session"


def test_equal_session_names_of_two_tenants_are_two_conversations() -> None:
    pool = replicas(4)
    r = router()
    ours, theirs = RouteRequest((), "chat-1", tenant="a"), RouteRequest((), "chat-1", tenant="b")
    assert ours.session_hash != theirs.session_hash
    assert RouteRequest((), None).session_hash is None
    home = rendezvous("chat-1", pool)
    elsewhere = next(x for x in pool if x is not home)
    r.dispatched(ReplicaChoice(elsewhere, "load", 0, 0), ours)  # a's conversation moved
    moved, kept = r.choose(pool, ours), r.choose(pool, theirs)
    assert moved is not None and moved.replica is elsewhere
    assert kept is not None and kept.replica is home


def test_saturated_engine_is_avoided_even_with_a_cache_hit() -> None:
    pool = replicas(2)
    loads: dict[str, EngineLoad] = {}
    r = router(loads=loads)
    holder = send(r, pool, RouteRequest(tuple(range(50))))
    loads[holder.url] = EngineLoad(waiting=100, kv_usage=0.5)
    decision = r.choose(pool, RouteRequest(tuple(range(50))))
    assert decision is not None
    assert decision.replica is not holder


def test_unhealthy_and_excluded_replicas_are_never_chosen() -> None:
    a, b, c = replicas(3)
    a.healthy = False
    r = router()
    decision = r.choose([a, b, c], RouteRequest(()), frozenset({b}))
    assert decision is not None
    assert decision.replica is c
    c.healthy = False
    assert r.choose([a, b, c], RouteRequest(()), frozenset({b})) is None


def test_exact_ties_rotate() -> None:
    pool = replicas(3)
    r = router()
    picked = [r.choose(pool, RouteRequest(())) for _ in range(6)]
    assert [d.replica for d in picked if d] == pool + pool
    assert all(d is not None and d.reason == "rotation" for d in picked)


def test_round_robin_baseline_rotates_over_healthy_replicas() -> None:
    a, b, c = replicas(3)
    b.healthy = False
    rr = RoundRobinRouter()
    chosen = [rr.choose([a, b, c], RouteRequest(())) for _ in range(4)]
    assert [d.replica for d in chosen if d] == [a, c, a, c]


def test_cached_share_is_what_the_best_healthy_replica_holds() -> None:
    pool = replicas(2)
    r = router()
    holder = send(r, pool, RouteRequest(tuple(range(8))))
    assert r.cached_share(pool, RouteRequest((*range(6), 50, 51))) == 6 / 8
    assert r.cached_share(pool, RouteRequest((99,))) == 0.0
    assert r.cached_share(pool, RouteRequest(())) == 0.0
    holder.healthy = False
    assert r.cached_share(pool, RouteRequest(tuple(range(8)))) == 0.0
    assert RoundRobinRouter().cached_share(pool, RouteRequest((1,))) == 0.0


def _session_homed_on(pool: list[Replica], replica: Replica, taken: set[str]) -> str:
    """A session id whose rendezvous winner is `replica` (and not used yet)."""
    for i in range(1000):
        session = f"conv-{i}"
        if session not in taken and rendezvous(session, pool) is replica:
            taken.add(session)
            return session
    raise AssertionError("no such session id")


def test_a_shared_opening_does_not_decide_where_new_conversations_live() -> None:
    """Agents open every conversation with the same system prompt and tools: once two
    conversations began with it, a third is placed by its session's home, not by the
    replica that happened to compute the shared prefix first."""
    a, b = pool = replicas(2)
    r = router()
    opening = tuple(range(30))  # system prompt + tools, shared by every conversation
    taken: set[str] = set()
    for i in range(2):  # the first two both go where the opening already is
        send(r, pool, RouteRequest((*opening, 100 + i), _session_homed_on(pool, a, taken)))
    third = RouteRequest((*opening, 200), _session_homed_on(pool, b, taken))
    decision = r.choose(pool, third)
    assert decision is not None
    assert decision.replica is b
    assert decision.reason == "session"
    assert decision.cached_blocks == 0  # reported as it is: b computes the opening once
    r.dispatched(decision, third)
    # Its next turn stays on b: the opening is b's too now, and the history is only there.
    follow_up = r.choose(pool, RouteRequest((*opening, 200, 201), third.session))
    assert follow_up is not None
    assert follow_up.replica is b


def test_a_prefix_one_other_conversation_began_with_still_attracts() -> None:
    a, b = pool = replicas(2)
    r = router()
    taken: set[str] = set()
    own = tuple(range(500, 540))  # one conversation's long private opening
    send(r, pool, RouteRequest(own, _session_homed_on(pool, a, taken)))
    # A fork of it (same 40 blocks, new session homed elsewhere): the cache wins.
    decision = r.choose(pool, RouteRequest((*own, 7), _session_homed_on(pool, b, taken)))
    assert decision is not None
    assert decision.replica is a
    assert decision.reason == "prefix"


def test_established_conversations_keep_their_prefix_affinity() -> None:
    """The rule is for placing a conversation; a known one is priced by what each
    replica really holds."""
    a, _ = pool = replicas(2)
    r = router()
    opening = tuple(range(30))
    taken: set[str] = set()
    for i in range(3):
        send(r, pool, RouteRequest((*opening, 100 + i), _session_homed_on(pool, a, taken)))
    session = sorted(taken)[0]
    decision = r.choose(pool, RouteRequest((*opening, 100, 101), session))
    assert decision is not None
    assert decision.replica is a


def test_the_shared_opening_rule_can_be_turned_off() -> None:
    a, b = pool = replicas(2)
    r = router(shared_opening_conversations=0)
    opening = tuple(range(30))
    taken: set[str] = set()
    for i in range(2):
        send(r, pool, RouteRequest((*opening, 100 + i), _session_homed_on(pool, a, taken)))
    decision = r.choose(pool, RouteRequest((*opening, 200), _session_homed_on(pool, b, taken)))
    assert decision is not None
    assert decision.replica is a  # 30 blocks of cache outbid the session's home


def test_a_lost_cache_keeps_what_was_sent_after_the_engine_lost_it() -> None:
    """An engine publishes a clear after its next step, which ran the requests sent since
    its previous message: `forget(keep_since=...)` drops everything else."""
    now = [0.0]
    index = PrefixIndex(100)
    router = CacheAwareRouter(
        CacheAwareSettings(weights={"prefix": 1.0}), index, LoadTracker(15.0, lambda: now[0])
    )
    router.learn("a", [1, 2], 1.0)
    now[0] = 5.0
    router.learn("a", [7, 8], 1.0)
    router.forget("a", keep_since=3.0)
    assert (index.match("a", [1, 2]), index.match("a", [7, 8])) == (0, 2)
    router.forget("a")
    assert index.match("a", [7, 8]) == 0


def test_requests_other_gateways_have_in_flight_count_in_the_queue_it_prices() -> None:
    pool = replicas(2)
    r = router()
    request = RouteRequest((1, 2, 3))
    pool[0].inflight = 1  # this gateway's own: replica 1 is the less busy
    decision = r.choose(pool, request)
    assert decision is not None and decision.replica is pool[1]
    # The other gateways (gateway/sharing/) have four at replica 1, none at replica 0.
    r.peer_inflight = lambda replica_id: 4 if replica_id == pool[1].id else 0
    decision = r.choose(pool, request)
    assert decision is not None and decision.replica is pool[0]
    assert decision.costs["queue"] == 1.0


def test_what_a_replica_evicted_of_a_conversation_caps_what_it_is_believed_to_hold() -> None:
    """The engine's KV events say the session's replica evicted part of its last turn
    (gateway/fleet/engine_chains.py): the index's belief is capped to what is left, in
    proportion, and the choice carries the engine's figure for the expectation."""
    pool, clock = replicas(2), Clock()
    r = router(clock)
    request = RouteRequest(tuple(range(40)), session="conv-1")
    home = send(r, pool, request)
    clock.now = 1000.0  # the first turn's work no longer counts
    follow_up = RouteRequest((*range(40), 41), session="conv-1")

    def evicted(tenant: str, session: str, replicas: Sequence[str]) -> dict[str, Held]:
        assert (tenant, session) == ("default", "conv-1")
        return {home.id: Held(tokens=2_500, whole=False, turn_tokens=10_000, turn_blocks=40)}

    r.engine_held = evicted
    decision = r.choose(pool, follow_up)
    assert decision is not None
    assert decision.replica is home  # the session still decides; 10 blocks are left there
    assert decision.cached_blocks == 10
    assert decision.engine_held == Held(2_500, False, 10_000, 40)
    r.engine_held = lambda tenant, session, ids: {home.id: Held(5_000, True, 5_000, 40)}  # no cap
    decision = r.choose(pool, follow_up)
    assert decision is not None
    assert decision.cached_blocks == 40
    assert decision.engine_held == Held(5_000, True, 5_000, 40)
