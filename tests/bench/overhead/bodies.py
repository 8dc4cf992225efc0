"""The request bodies of the overhead benchmark, built from real tau-bench trajectories.

- `tau`: one real agent turn: the airline policy as the system prompt, the 14 tool schemas
  as `tools`, and a real conversation (user turns, assistant tool calls, tool results) up
  to its last user or tool message, the point where the agent answers next. The
  trajectory of median size is used (about 26 KB of JSON).
- `long50k`: a 50,000-token prompt (about 200 KB of text): the same system prompt and
  tools, then one user message holding whole tau-bench conversations, transcribed one
  after another until it reaches 200,000 characters (about 4 characters a token).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fault.harness import ROOT

TRAJECTORIES = (
    ROOT.parent / "shared" / "data" / "agent-trajectories" / "tau_bench_airline_dev.jsonl"
)
LONG_CHARS = 200_000


def _rows() -> list[dict[str, Any]]:
    with TRAJECTORIES.open() as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _size(row: dict[str, Any]) -> int:
    return len(json.dumps({"messages": row["messages"], "tools": row["tools"]}))


def tau_body() -> dict[str, Any]:
    rows = sorted(_rows(), key=_size)
    row = rows[len(rows) // 2]
    messages: list[dict[str, Any]] = row["messages"]
    last = max(i for i, m in enumerate(messages) if m["role"] in ("user", "tool"))
    return {
        "model": "",  # the load generator sets the name each target expects
        "messages": messages[: last + 1],
        "tools": row["tools"],
        "max_tokens": 256,
        "temperature": 0,
    }


def long_body() -> dict[str, Any]:
    rows = _rows()
    system = rows[0]["messages"][0]
    parts: list[str] = []
    size = 0
    for row in rows:
        for message in row["messages"][1:]:
            text = message.get("content") or json.dumps(message.get("tool_calls"))
            parts.append(f"[{message['role']}] {text}")
            size += len(parts[-1]) + 1
            if size >= LONG_CHARS:
                break
        if size >= LONG_CHARS:
            break
    prompt = "Summarise what these support conversations have in common:\n" + "\n".join(parts)
    return {
        "model": "",
        "messages": [system, {"role": "user", "content": prompt[:LONG_CHARS]}],
        "tools": rows[0]["tools"],
        "max_tokens": 256,
        "temperature": 0,
    }


def write_bodies(directory: Path) -> dict[str, Path]:
    """Writes both bodies as JSON files; returns their paths by name."""
    paths = {"tau": directory / "tau.json", "long50k": directory / "long50k.json"}
    paths["tau"].write_text(json.dumps(tau_body()))
    paths["long50k"].write_text(json.dumps(long_body()))
    return paths
