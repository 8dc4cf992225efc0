"""The other gateways' in-flight counts: summed per replica, this gateway's own skipped, and
a gateway that stops renewing its field stops counting (judged on the reader's clock)."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from gateway.sharing.inflight import PeerInflight, TenantCounts, encode_counts


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


NO_TENANTS: TenantCounts = {}


def counts(round_no: int, totals: Mapping[str, int], tenants: TenantCounts = NO_TENANTS) -> bytes:
    return encode_counts(round_no, totals, tenants)


def test_counts_of_the_other_gateways_add_up_and_its_own_is_skipped() -> None:
    peers = PeerInflight("me", ttl_s=2.0, clock=Clock())
    peers.update(
        "main",
        {
            b"me": counts(1, {"main/a": 50}),
            b"gw-2": counts(7, {"main/a": 2, "main/b": 1}),
            b"gw-3": counts(3, {"main/a": 3}),
        },
    )
    assert (peers.get("main/a"), peers.get("main/b"), peers.get("main/c")) == (5, 1, 0)


def test_a_gateway_that_stops_renewing_stops_counting_and_is_named_for_deletion() -> None:
    clock = Clock()
    peers = PeerInflight("me", ttl_s=2.0, clock=clock)
    alive, dead = counts(1, {"main/a": 1}), counts(1, {"main/a": 4})
    assert peers.update("main", {b"alive": alive, b"dead": dead}) == []
    clock.now += 1.5
    alive = counts(2, {"main/a": 1})  # renewed: its round moved
    assert peers.update("main", {b"alive": alive, b"dead": dead}) == []
    assert peers.get("main/a") == 5
    clock.now += 1.0  # `dead` has not moved for 2.5 s
    assert peers.update("main", {b"alive": alive, b"dead": dead}) == [b"dead"]
    assert peers.get("main/a") == 1


def test_an_unreadable_field_counts_nothing_and_is_named_for_deletion() -> None:
    peers = PeerInflight("me", ttl_s=2.0, clock=Clock())
    assert peers.update("main", {b"junk": b"{", b"gw-2": counts(1, {"main/a": 2})}) == [b"junk"]
    assert peers.get("main/a") == 2


def test_clear_forgets_every_peer() -> None:
    peers = PeerInflight("me", ttl_s=2.0, clock=Clock())
    peers.update("main", {b"gw-2": counts(1, {"main/a": 2})})
    peers.clear()
    assert peers.get("main/a") == 0


def test_per_tenant_counts_add_up_and_a_field_without_them_counts_in_totals_only() -> None:
    peers = PeerInflight("me", ttl_s=2.0, clock=Clock())
    earlier_version = orjson.dumps({"n": 1, "c": {"main/a": 4}})
    peers.update(
        "main",
        {
            b"me": counts(1, {"main/a": 9}, {"main/a": {"flood": 9}}),
            b"gw-2": counts(1, {"main/a": 3}, {"main/a": {"flood": 2, "quiet": 1}}),
            b"gw-3": orjson.dumps(
                {"n": 1, "c": {"main/a": 2}, "t": {"main/a": {"flood": 2}, "main/b": "junk"}}
            ),
            b"gw-4": earlier_version,
        },
    )
    assert peers.get("main/a") == 9
    assert peers.tenants("main/a") == {"flood": 4, "quiet": 1}
    assert peers.tenants("main/b") == {}
    peers.clear()
    assert peers.tenants("main/a") == {}
