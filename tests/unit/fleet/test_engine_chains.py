"""Matching an engine's KV blocks to conversations through their chains (no tokenizer)."""

from __future__ import annotations

from gateway.fleet.engine_chains import Conversation, EngineChains, Held
from gateway.fleet.kv_event_wire import AllBlocksCleared, BlocksRemoved, BlocksStored, EventBatch

SIZE = 4  # tokens per engine block
REPLICA = "pool/r0"
CONVERSATION: Conversation = ("default", "conv-1", REPLICA)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stored(first: int, last: int, parent: int | None, medium: str | None = None) -> EventBatch:
    """Blocks `first`..`last` (their hashes are their numbers), chained after `parent`."""
    hashes = tuple(range(first, last + 1))
    return EventBatch(0, 0.0, (BlocksStored(hashes, parent, len(hashes) * SIZE, SIZE, medium),))


def removed(*hashes: int) -> EventBatch:
    return EventBatch(0, 0.0, (BlocksRemoved(hashes, None),))


def turn(chains: EngineChains, clock: Clock, batch: EventBatch, prompt: int) -> None:
    """A turn sent now, its blocks stored by the engine, then answered."""
    sent = clock.now
    clock.now += 0.1
    chains.apply(REPLICA, batch, clock.now)
    clock.now += 0.1
    chains.answered(CONVERSATION, sent, prompt, 1)
    clock.now += 5.0  # the agent's next request comes later


def two_turns() -> tuple[EngineChains, Clock]:
    clock = Clock()
    chains = EngineChains(clock=clock)
    turn(chains, clock, stored(1, 10, None), prompt=42)  # 10 whole blocks, 2 tokens over
    turn(chains, clock, stored(11, 15, 10), prompt=61)  # extends turn 1's chain
    return chains, clock


def test_a_conversation_wholly_held_is_its_last_turn_in_whole_blocks() -> None:
    chains, _ = two_turns()
    assert chains.held(CONVERSATION) == Held(tokens=60, whole=True, turn_tokens=61, turn_blocks=1)


def test_evicting_the_tail_of_a_conversation_shortens_what_is_held() -> None:
    chains, _ = two_turns()
    chains.apply(REPLICA, removed(15, 14, 13), None)  # vLLM evicts tails first
    held = chains.held(CONVERSATION)
    assert held is not None
    assert (held.tokens, held.whole) == (12 * SIZE, False)


def test_a_clear_leaves_nothing_held_and_new_stores_count_again() -> None:
    chains, clock = two_turns()
    chains.apply(REPLICA, EventBatch(0, 0.0, (AllBlocksCleared(),)), clock.now)
    held = chains.held(CONVERSATION)
    assert held is not None and held.tokens == 0 and not held.whole
    chains.apply(REPLICA, stored(1, 15, None), clock.now)  # the next turn recomputes it all
    held = chains.held(CONVERSATION)
    assert held is not None and held.whole


def test_other_conversations_stores_are_not_taken_for_this_ones() -> None:
    clock = Clock()
    chains = EngineChains(clock=clock)
    turn(chains, clock, stored(1, 10, None), prompt=40)
    # Another conversation branching off the shared first blocks, stored meanwhile at the
    # depth this conversation's next turn will reach.
    chains.apply(REPLICA, stored(101, 105, 3), clock.now)
    turn(chains, clock, stored(11, 12, 10), prompt=48)
    chains.apply(REPLICA, removed(105, 104), None)  # the other one's tail: not this one's
    held = chains.held(CONVERSATION)
    assert held is not None and held.whole and held.tokens == 48


def test_two_first_turns_at_once_at_the_same_depth_are_not_guessed() -> None:
    clock = Clock()
    chains = EngineChains(clock=clock)
    sent = clock.now
    chains.apply(REPLICA, stored(1, 10, None), clock.now)
    chains.apply(REPLICA, stored(21, 30, None), clock.now)
    clock.now += 0.1
    chains.answered(CONVERSATION, sent, 40, 1)
    clock.now += 5.0
    assert chains.held(CONVERSATION) is None


def test_stores_published_after_the_answer_still_find_the_turn() -> None:
    clock = Clock()
    chains = EngineChains(clock=clock)
    sent = clock.now
    chains.answered(CONVERSATION, sent, 40, 1)  # the events of the first turn's step...
    chains.apply(REPLICA, stored(1, 10, None), clock.now)  # no engine known yet: not kept
    assert chains.held(CONVERSATION) is None
    sent = clock.now
    clock.now += 0.1
    chains.answered(CONVERSATION, sent, 60, 1)
    assert chains.held(CONVERSATION) is None  # ...not in yet: looked for again later
    clock.now += 0.2
    chains.apply(REPLICA, stored(11, 15, 10), clock.now)
    held = chains.held(CONVERSATION)
    assert held is not None and held.whole and held.tokens == 60


def test_offloaded_blocks_and_forgotten_engines_say_nothing() -> None:
    chains, _ = two_turns()
    chains.apply(REPLICA, stored(16, 20, 15, medium="CPU"), None)  # an offloading tier
    held = chains.held(CONVERSATION)
    assert held is not None and held.tokens == 60
    chains.forget(REPLICA)  # restarted
    assert chains.held(CONVERSATION) is None
    assert chains.held(("default", "unknown", REPLICA)) is None


def test_a_replica_whose_events_are_not_followed_keeps_no_turns() -> None:
    clock = Clock()
    chains = EngineChains(clock=clock)
    chains.answered(("default", "c", "pool/other"), clock.now, 40, 1)
    assert chains.held(("default", "c", "pool/other")) is None


def test_a_turn_answered_before_the_one_before_it_was_found_still_chains() -> None:
    """Events come after answers: the next turn can be answered before the previous
    turn's stores are in. It keeps its link to that turn, so another conversation's
    store at its own depth does not make it ambiguous."""
    clock = Clock()
    chains = EngineChains(clock=clock)
    chains.apply(REPLICA, stored(201, 210, None), clock.now)  # another conversation's
    clock.now += 0.1
    first_sent = clock.now
    clock.now += 0.1
    chains.answered(CONVERSATION, first_sent, 40, 1)  # its stores not in yet
    second_sent = clock.now
    clock.now += 0.1
    chains.answered(CONVERSATION, second_sent, 48, 1)  # nor these
    chains.apply(REPLICA, stored(1, 10, None), clock.now)  # the first turn's
    chains.apply(REPLICA, stored(11, 12, 10), clock.now)  # the second's, depth 12
    chains.apply(REPLICA, stored(211, 212, 210), clock.now)  # the other's, at depth 12 too
    clock.now += 5.0
    held = chains.held(CONVERSATION)
    assert held is not None and held.whole and held.tokens == 48
    chains.apply(REPLICA, removed(12), None)
    held = chains.held(CONVERSATION)
    assert held is not None and held.tokens == 44
