"""What the gateway remembers of conversations a tier's window refused: an estimate from the
refusal's tokens per byte, forgotten after a while and past a bound."""

from __future__ import annotations

from gateway.tiering.outgrown import OutgrownWindows


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_refusal_estimates_the_conversations_later_requests_by_their_size() -> None:
    windows = OutgrownWindows()
    assert windows.needed(7, "auto", lambda: 40_000) is None
    windows.refused(7, "auto", tokens=8_193, size=32_772)  # 4 bytes a token
    assert windows.needed(7, "auto", lambda: 40_000) == 10_000
    assert windows.needed(7, "auto", lambda: 4_000) == 1_000  # compacted: small again
    assert windows.needed(7, "other-alias", lambda: 40_000) is None
    assert windows.needed(8, "auto", lambda: 40_000) is None  # another conversation
    assert windows.needed(None, "auto", lambda: 40_000) is None  # no conversation known


def test_the_size_is_read_only_for_a_conversation_on_record() -> None:
    windows = OutgrownWindows()
    windows.refused(7, "auto", tokens=100, size=400)

    def size() -> int:
        raise AssertionError("read for a conversation with no refusal")

    assert windows.needed(8, "auto", size) is None


def test_an_unused_entry_is_forgotten_after_its_ttl_and_a_used_one_is_kept() -> None:
    clock = Clock()
    windows = OutgrownWindows(ttl_s=10, clock=clock)
    windows.refused(1, "auto", tokens=100, size=400)
    windows.refused(2, "auto", tokens=100, size=400)
    clock.now = 8
    assert windows.needed(1, "auto", lambda: 400) == 100  # used: kept another 10 s
    clock.now = 12
    assert windows.needed(2, "auto", lambda: 400) is None
    assert windows.needed(1, "auto", lambda: 400) == 100
    assert len(windows) == 1


def test_past_its_capacity_the_least_recently_used_is_forgotten() -> None:
    windows = OutgrownWindows(capacity=2)
    windows.refused(1, "auto", tokens=100, size=400)
    windows.refused(2, "auto", tokens=100, size=400)
    windows.needed(1, "auto", lambda: 400)  # 1 is now the most recent
    windows.refused(3, "auto", tokens=100, size=400)
    assert len(windows) == 2
    assert windows.needed(2, "auto", lambda: 400) is None
    assert windows.needed(1, "auto", lambda: 400) == 100


def test_nonsense_refusals_are_not_kept() -> None:
    windows = OutgrownWindows()
    windows.refused(1, "auto", tokens=0, size=400)
    windows.refused(1, "auto", tokens=100, size=0)
    assert len(windows) == 0
