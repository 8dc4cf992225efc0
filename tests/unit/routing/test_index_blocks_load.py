"""Prefix blocks, the per-replica prefix index and the decaying load signal."""

from __future__ import annotations

from gateway.prompt.blocks import chain_hashes, conversation_key, request_blocks
from gateway.routing.index import PrefixIndex
from gateway.routing.load import LoadTracker

SYSTEM = {"role": "system", "content": "You are an airline agent. " * 40}


def chat(
    *messages: dict[str, str], tools: list[dict[str, object]] | None = None
) -> dict[str, object]:
    body: dict[str, object] = {"model": "m", "messages": [SYSTEM, *messages]}
    if tools:
        body["tools"] = tools
    return body


def test_chained_hashes_share_exactly_the_common_prefix() -> None:
    a = chain_hashes(b"x" * 128 + b"A" * 128, 64)
    b = chain_hashes(b"x" * 128 + b"B" * 128, 64)
    assert len(a) == 4
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    assert a[3] != b[3]


def test_only_whole_blocks_count() -> None:
    assert chain_hashes(b"x" * 127, 64) == chain_hashes(b"x" * 64, 64)
    assert chain_hashes(b"x" * 63, 64) == ()


def test_block_order_and_every_byte_matter() -> None:
    a, b = b"A" * 64, b"B" * 64
    assert chain_hashes(a + b, 64)[1] != chain_hashes(b + a, 64)[1]
    base = bytearray(b"y" * 256)
    ids = chain_hashes(bytes(base), 64)
    for position in range(256):  # one byte changed anywhere changes that block's id on
        changed = bytearray(base)
        changed[position] ^= 0x80
        other = chain_hashes(bytes(changed), 64)
        block = position // 64
        assert other[:block] == ids[:block]
        assert all(x != y for x, y in zip(other[block:], ids[block:], strict=True))


def test_ids_are_fixed_across_processes_and_versions() -> None:
    # The request log stores these ids and several gateways must agree on them.
    assert chain_hashes(b"agent" * 26, 64)[0] == chain_hashes(b"agent" * 13, 64)[0]
    assert chain_hashes(bytes(range(64)), 64) == (14914201494925833272,)


def test_a_later_turn_extends_the_earlier_turns_blocks() -> None:
    turn1 = request_blocks(chat({"role": "user", "content": "Change my flight"}), 64)
    turn2 = request_blocks(
        chat(
            {"role": "user", "content": "Change my flight"},
            {"role": "assistant", "content": "Sure " * 30},
        ),
        64,
    )
    assert len(turn2) > len(turn1)
    assert turn2[: len(turn1)] == turn1


def test_tools_are_part_of_the_prefix_after_the_system_prompt() -> None:
    tool: dict[str, object] = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object"}},
    }
    user = {"role": "user", "content": "hello " * 50}
    plain = request_blocks(chat(user), 64)
    with_tools = request_blocks(chat(user, tools=[tool] * 5), 64)
    common = 0
    while plain[common] == with_tools[common]:
        common += 1
    assert common >= 1  # the system prompt's blocks are shared
    assert common < len(plain)  # from the tools on, the prefixes differ


def test_completion_prompt_blocks() -> None:
    assert request_blocks({"model": "m", "prompt": "y" * 300}, 64) == chain_hashes(b"y" * 300, 64)


def test_index_matches_leading_run_and_evicts_tails_first() -> None:
    index = PrefixIndex(blocks_per_replica=4)
    index.record("r1", [1, 2, 3])
    assert index.match("r1", [1, 2, 9]) == 2
    assert index.match("r1", [9, 1, 2]) == 0
    assert index.match("r2", [1]) == 0
    index.record("r1", [7, 8])  # 5 blocks > 4: the oldest tail (3) goes, its prefix stays
    assert index.match("r1", [1, 2, 3]) == 2
    assert index.match("r1", [7, 8]) == 2
    index.forget("r1")
    assert index.match("r1", [7]) == 0


def test_match_finds_the_exact_leading_run_at_every_length() -> None:
    index = PrefixIndex(blocks_per_replica=1000)
    held = list(range(100, 140))
    index.record("r", held)
    for k in range(0, 41):
        assert index.match("r", [*held[:k], 999, 998]) == k


def test_load_decays_with_its_half_life() -> None:
    now = [0.0]
    load = LoadTracker(half_life_s=10.0, clock=lambda: now[0])
    load.add("r", 100.0)
    now[0] = 10.0
    assert abs(load.recent("r") - 50.0) < 1e-6
    load.add("r", 50.0)
    now[0] = 20.0
    assert abs(load.recent("r") - 50.0) < 1e-6
    assert load.recent("other") == 0.0


def test_a_conversation_keeps_its_key_from_turn_to_turn() -> None:
    user = {"role": "user", "content": "Change my flight"}
    turn1 = chat(user)
    turn2 = chat(user, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "2"})
    key1 = conversation_key(turn1, request_blocks(turn1, 64))
    key2 = conversation_key(turn2, request_blocks(turn2, 64))
    assert key1 is not None
    assert key1 == key2
    other = chat({"role": "user", "content": "Cancel my flight"})
    assert conversation_key(other, request_blocks(other, 64)) != key1


def test_a_long_first_message_is_keyed_by_its_length_and_ends() -> None:
    """Read in bounded time: a 200,000-character prompt is not serialised whole per turn.
    Its ends and length tell conversations apart; an edit only in the middle does not
    (a collision only keeps two conversations on one replica)."""
    text = "".join(f"line {i}\n" for i in range(30_000))
    first = chat({"role": "user", "content": text})
    key = conversation_key(first, request_blocks(first, 64))
    assert key is not None
    later = chat({"role": "user", "content": text}, {"role": "assistant", "content": "ok"})
    assert conversation_key(later, request_blocks(later, 64)) == key
    for changed in (text + "!", "!" + text[1:], text[:-1] + "?"):
        other = chat({"role": "user", "content": changed})
        assert conversation_key(other, request_blocks(other, 64)) != key
    middle = len(text) // 2
    edited = chat({"role": "user", "content": text[:middle] + "#" + text[middle + 1 :]})
    assert conversation_key(edited, request_blocks(edited, 64)) == key


def test_no_conversation_key_without_a_message_after_the_system_prompt() -> None:
    only_system = chat()
    assert conversation_key(only_system, request_blocks(only_system, 64)) is None
    assert conversation_key({"model": "m", "prompt": "y" * 300}, (1, 2)) is None
    assert conversation_key(chat({"role": "user", "content": "hi"}), ()) is None
