"""Agent conversations turned into a replay trace, one request per assistant turn."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.offline.replay.conversations import main, turns
from gateway.offline.replay.traces import read_trace

SYSTEM = {"role": "system", "content": "You are an airline agent. " * 60}


def conversation(name: str, asks: list[str]) -> dict[str, object]:
    messages: list[dict[str, str]] = [SYSTEM]
    for ask in asks:
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": "ok"}]
    return {"id": name, "tools": [], "messages": messages}


def test_every_assistant_turn_is_a_request_that_extends_the_previous_one() -> None:
    convs = [
        conversation("a", ["change my flight " * 40, "to Boston " * 40]),
        conversation("b", ["hi"]),
    ]
    entries = list(
        turns(convs, block_bytes=64, bytes_per_token=4, open_every_s=1, turn_gap_s=2, seed=0)
    )
    assert [e["session"] for e in entries].count("a") == 2
    assert [e["ts"] for e in entries] == sorted(e["ts"] for e in entries)
    first, second = (e for e in entries if e["session"] == "a")
    assert second["ts"] - first["ts"] == 2
    assert second["blocks"][: len(first["blocks"]) - 1] == first["blocks"][:-1]
    other = next(e for e in entries if e["session"] == "b")
    assert other["blocks"][0] == first["blocks"][0]  # the shared system prompt


def test_the_written_trace_is_read_by_replay(tmp_path: Path) -> None:
    source = tmp_path / "conversations.jsonl"
    source.write_text(json.dumps(conversation("a", ["hello " * 100, "again"])) + "\n")
    out = tmp_path / "trace.jsonl"
    assert main(["--conversations", str(source), "--out", str(out)]) == 0
    requests = list(read_trace(out, block_tokens=128))
    assert len(requests) == 2
    assert requests[0].session == "a" and requests[0].blocks
