"""Counting how conversations begin (gateway/routing/openings.py)."""

from __future__ import annotations

from gateway.routing.openings import ConversationOpenings


def test_shared_lead_counts_leading_blocks_enough_conversations_began_with() -> None:
    openings = ConversationOpenings(threshold=2)
    openings.record((1, 2, 3, 10))
    assert openings.shared_lead((1, 2, 3, 4)) == 0  # one conversation is not "shared"
    openings.record((1, 2, 3, 20))
    assert openings.shared_lead((1, 2, 3, 4)) == 3
    assert openings.shared_lead((1, 2, 9, 3)) == 2  # only the leading run counts
    assert openings.shared_lead((5, 1, 2)) == 0
    assert openings.shared_lead(()) == 0


def test_threshold_zero_is_off() -> None:
    openings = ConversationOpenings(threshold=0)
    for _ in range(5):
        openings.record((1, 2))
    assert openings.shared_lead((1, 2)) == 0


def test_bounded_the_oldest_openings_are_forgotten() -> None:
    openings = ConversationOpenings(threshold=1, capacity=4)
    openings.record((1, 2))
    openings.record((3, 4, 5))
    assert openings.shared_lead((1,)) == 0  # evicted to make room
    assert openings.shared_lead((3, 4, 5)) == 3
