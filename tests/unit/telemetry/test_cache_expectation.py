"""The cached tokens routing expected: a conversation's next turn expects the previous
turn's prompt in whole KV blocks; the block size is learned from what engines report."""

from __future__ import annotations

from gateway.telemetry.cache_expectation import CacheExpectation
from gateway.telemetry.record import RequestRecord

BLOCKS = tuple(range(100, 140))  # 40 prefix blocks


def answered(
    blocks: tuple[int, ...],
    held: int,
    prompt: int | None,
    cached: int | None,
    *,
    session: str | None = "conv:1",
    replica: str = "pool/a",
    tenant: str = "default",
    status: int = 200,
) -> RequestRecord:
    record = RequestRecord.detached()
    record.tenant, record.pool, record.replica, record.status = tenant, "pool", replica, status
    record.blocks, record.cached_blocks, record.route_session = blocks, held, session
    record.result.prompt_tokens, record.result.cached_tokens = prompt, cached
    return record


def learned_granule(expectation: CacheExpectation, granule: int) -> None:
    """Reports of another conversation whose cached counts share the divisor `granule`."""
    for count in (5, 7, 11, 13):
        expectation.observe(answered((1,), 0, 1000, count * granule, session="other"))


def test_the_next_turn_expects_the_previous_prompt_in_whole_blocks() -> None:
    expectation = CacheExpectation()
    learned_granule(expectation, 32)
    assert expectation.observe(answered(BLOCKS[:30], 0, 9_772, 0)) == 0
    # The next turn resends it: routing believes all 30 blocks held, the engine holds
    # 9,772 tokens in blocks of 32.
    assert expectation.observe(answered(BLOCKS[:31], 30, 9_923, 9_760)) == 9_760


def test_what_the_engine_evicted_of_the_last_turn_is_not_expected() -> None:
    """Routing capped its belief with the engine's KV events (gateway/fleet/
    engine_chains.py): the expectation follows the eviction, not the turn before it."""
    expectation = CacheExpectation()
    learned_granule(expectation, 32)
    expectation.observe(answered(BLOCKS[:30], 0, 9_772, 0))
    evicted = answered(BLOCKS[:31], 30, 9_923, 6_400)
    evicted.engine_held_tokens, evicted.engine_evicted = 6_400, True
    assert expectation.observe(evicted) == 6_400
    elsewhere = answered(BLOCKS, 20, 10_001, None, session=None)  # by the share of blocks
    elsewhere.engine_held_tokens, elsewhere.engine_evicted = 1_024, True
    assert expectation.observe(elsewhere) == 1_024
    whole = answered(BLOCKS, 20, 10_001, None, session=None)  # held whole: the belief stands
    whole.engine_held_tokens = 1_024
    assert expectation.observe(whole) == 4_992


def test_without_a_previous_turn_the_share_of_blocks_is_rounded_to_the_granule() -> None:
    expectation = CacheExpectation()
    assert expectation.observe(answered(BLOCKS, 20, 10_001, None, session=None)) == 5_000
    learned_granule(expectation, 32)
    assert expectation.observe(answered(BLOCKS, 20, 10_001, None, session=None)) == 4_992


def test_the_granule_is_trusted_only_after_several_reports() -> None:
    expectation = CacheExpectation()
    expectation.observe(answered((1,), 0, 9_000, 5_440, session=None))  # 5,440 alone
    assert expectation.observe(answered(BLOCKS, 20, 10_001, None, session=None)) == 5_000


def test_another_replica_tenant_or_a_shorter_belief_does_not_use_the_turn() -> None:
    expectation = CacheExpectation()
    learned_granule(expectation, 32)
    expectation.observe(answered(BLOCKS[:30], 0, 9_772, 0))
    elsewhere = answered(BLOCKS[:31], 30, 9_923, None, replica="pool/b")
    assert expectation.observe(elsewhere) == 9_923 * 30 // 31 // 32 * 32
    theirs = answered(BLOCKS[:31], 30, 9_923, None, tenant="other")
    assert expectation.observe(theirs) == 9_923 * 30 // 31 // 32 * 32
    fewer = answered(BLOCKS[:31], 12, 9_923, None)  # believed only a part held
    assert expectation.observe(fewer) == 9_923 * 12 // 31 // 32 * 32


def test_nothing_is_expected_without_blocks_or_a_reported_prompt() -> None:
    expectation = CacheExpectation()
    assert expectation.observe(answered((), 0, 100, 0)) is None
    assert expectation.observe(answered(BLOCKS, 3, None, None)) is None


def test_a_failed_request_teaches_nothing_about_its_conversation() -> None:
    expectation = CacheExpectation()
    learned_granule(expectation, 32)
    expectation.observe(answered(BLOCKS[:30], 0, 9_772, None, status=503))
    assert expectation.observe(answered(BLOCKS[:31], 30, 9_923, None)) == 9_600


def test_conversations_are_bounded() -> None:
    expectation = CacheExpectation(conversations=2)
    learned_granule(expectation, 32)
    for name in ("a", "b", "c"):
        expectation.observe(answered(BLOCKS[:30], 0, 9_772, 0, session=name))
    assert expectation.observe(answered(BLOCKS[:31], 30, 9_923, None, session="a")) == 9_600
    assert expectation.observe(answered(BLOCKS[:31], 30, 9_923, None, session="c")) == 9_760
