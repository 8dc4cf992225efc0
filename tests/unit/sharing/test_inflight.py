"""The other gateways' in-flight counts: summed per replica, this gateway's own skipped, and
a gateway that stops renewing its field stops counting (judged on the reader's clock)."""

from __future__ import annotations

from gateway.sharing.inflight import PeerInflight, encode_counts


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_counts_of_the_other_gateways_add_up_and_its_own_is_skipped() -> None:
    peers = PeerInflight("me", ttl_s=2.0, clock=Clock())
    peers.update(
        "main",
        {
            b"me": encode_counts(1, {"main/a": 50}),
            b"gw-2": encode_counts(7, {"main/a": 2, "main/b": 1}),
            b"gw-3": encode_counts(3, {"main/a": 3}),
        },
    )
    assert (peers.get("main/a"), peers.get("main/b"), peers.get("main/c")) == (5, 1, 0)


def test_a_gateway_that_stops_renewing_stops_counting_and_is_named_for_deletion() -> None:
    clock = Clock()
    peers = PeerInflight("me", ttl_s=2.0, clock=clock)
    alive, dead = encode_counts(1, {"main/a": 1}), encode_counts(1, {"main/a": 4})
    assert peers.update("main", {b"alive": alive, b"dead": dead}) == []
    clock.now += 1.5
    alive = encode_counts(2, {"main/a": 1})  # renewed: its round moved
    assert peers.update("main", {b"alive": alive, b"dead": dead}) == []
    assert peers.get("main/a") == 5
    clock.now += 1.0  # `dead` has not moved for 2.5 s
    assert peers.update("main", {b"alive": alive, b"dead": dead}) == [b"dead"]
    assert peers.get("main/a") == 1


def test_an_unreadable_field_counts_nothing_and_is_named_for_deletion() -> None:
    peers = PeerInflight("me", ttl_s=2.0, clock=Clock())
    assert peers.update("main", {b"junk": b"{", b"gw-2": encode_counts(1, {"main/a": 2})}) == [
        b"junk"
    ]
    assert peers.get("main/a") == 2


def test_clear_forgets_every_peer() -> None:
    peers = PeerInflight("me", ttl_s=2.0, clock=Clock())
    peers.update("main", {b"gw-2": encode_counts(1, {"main/a": 2})})
    peers.clear()
    assert peers.get("main/a") == 0
