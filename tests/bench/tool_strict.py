"""What asking vLLM to constrain tool calls (`strict: true`, the policy's
`tool_calls.strict`) costs, and what it buys, on one real `cpu-tiny` replica.

Each assistant turn of the tau-bench airline conversations that called a tool is asked
again with `tool_choice: "required"` (vLLM then constrains the call's envelope: which tool)
both ways: the tools as the client sent them, and with `strict: true` on every tool (vLLM
also constrains the arguments to each tool's schema). The tiny model's weights are random,
the worst case for a model's own calls. Reported: the engine's latency each way (p50, and
the ratio), and the share of answers whose every call passes the gateway's own contract
check (gateway/toolcalls/contract.py) each way.

    .venv/bin/python -m tests.bench.tool_strict [--turns 24] [--max-tokens 64] [--out FILE]

Prints a table and writes JSON (default .run/bench/tool-strict.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from engine.supervisor import ROOT
from gateway.toolcalls.contract import build_contract
from tests.bench.tau_routing import DATA, start_engines


def turns(limit: int) -> list[dict[str, Any]]:
    """Requests up to each assistant turn that called a tool: messages before it, tools."""
    found: list[dict[str, Any]] = []
    for line in DATA.read_text().splitlines():
        conversation = json.loads(line)
        for index, message in enumerate(conversation["messages"]):
            if message.get("role") == "assistant" and message.get("tool_calls"):
                found.append({"messages": conversation["messages"][:index],
                              "tools": conversation["tools"]})  # fmt: skip
                if len(found) >= limit:
                    return found
    return found


def strict(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**t, "function": {**t["function"], "strict": True}} for t in tools]


def ask(engine: httpx.Client, request: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    answer = engine.post("/v1/chat/completions", json=request)
    elapsed = time.perf_counter() - started
    answer.raise_for_status()
    body: dict[str, Any] = answer.json()
    return elapsed, body


def valid(body: dict[str, Any], tools: list[dict[str, Any]]) -> bool:
    calls = body["choices"][0]["message"].get("tool_calls") or []
    contract = build_contract(tools)
    return bool(calls) and all(contract.check(i, c)[2] is None for i, c in enumerate(calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / ".run/bench/tool-strict.json")
    args = parser.parse_args()
    asked = turns(args.turns)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work:
        for engines in start_engines(Path(work)):
            with httpx.Client(base_url=engines.urls[0], timeout=300) as engine:
                for i, turn in enumerate(asked):
                    base = {"model": "tiny", "messages": turn["messages"],
                            "tool_choice": "required", "max_tokens": args.max_tokens,
                            "temperature": 0}  # fmt: skip
                    row: dict[str, Any] = {}
                    for way, tools in (
                        ("as_sent", turn["tools"]),
                        ("strict", strict(turn["tools"])),
                    ):
                        ask(engine, {**base, "tools": tools, "max_tokens": 1})  # warm the prefix
                        seconds, body = ask(engine, {**base, "tools": tools})
                        message = body["choices"][0]["message"]
                        row[way] = {"s": seconds, "valid": valid(body, turn["tools"]),
                                    "calls": len(message.get("tool_calls") or []),
                                    "finish": body["choices"][0]["finish_reason"],
                                    "completion_tokens": body["usage"]["completion_tokens"]}  # fmt: skip
                    rows.append(row)
                    print(f"  turn {i + 1}/{len(asked)}", end="\r", flush=True)
            break
    summary: dict[str, Any] = {"turns": len(rows), "max_tokens": args.max_tokens}
    for way in ("as_sent", "strict"):
        summary[f"{way}_p50_s"] = round(statistics.median(r[way]["s"] for r in rows), 4)
        summary[f"{way}_valid_share"] = round(sum(r[way]["valid"] for r in rows) / len(rows), 3)
        summary[f"{way}_completion_tokens_mean"] = round(
            statistics.mean(r[way]["completion_tokens"] for r in rows), 1
        )
    summary["strict_over_as_sent_p50"] = round(
        summary["strict_p50_s"] / summary["as_sent_p50_s"], 3
    )
    print()
    for key, value in summary.items():
        print(f"{key:34} {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
