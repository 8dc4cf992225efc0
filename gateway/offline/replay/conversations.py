"""A replay trace from recorded agent conversations (tau-bench's JSONL: one `{id, tools,
messages}` per line), written as the gateway's own request log so `gateway replay` reads it.

    .venv/bin/python -m gateway.offline.replay.conversations --out FILE [--seed N]

Every assistant turn is one request: the conversation so far plus the tools, cut into
prefix blocks exactly as the gateway cuts a live request (gateway/prompt/blocks.py,
`block_bytes` as in the default policy), the conversation's id as its session. The
recordings have no timestamps, so arrivals are modelled and stated: conversations open at
seeded exponential gaps (`--open-every-s` on average) and each turn follows the previous
one after `--turn-gap-s` (the tool call and the agent's own think time). Tokens are
estimated at `--bytes-per-token` prompt bytes each.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.policy.routing import RoutingSpec
from gateway.prompt.blocks import prompt_bytes, request_blocks

TAU_BENCH = Path("../shared/data/agent-trajectories/tau_bench_airline_dev.jsonl")


def turns(
    conversations: list[dict[str, Any]],
    *,
    block_bytes: int,
    bytes_per_token: float,
    open_every_s: float,
    turn_gap_s: float,
    seed: int,
) -> Iterator[dict[str, Any]]:
    """Request-log entries (`ts`, `blocks`, `prompt_tokens`, `output_tokens`, `session`),
    in arrival order."""
    rng = random.Random(seed)
    opens = 0.0
    entries = []
    for conversation in conversations:
        opens += rng.expovariate(1 / open_every_s)
        messages = conversation["messages"]
        at = opens
        for i, message in enumerate(messages):
            if message.get("role") != "assistant" or i == 0:
                continue
            body = {"messages": messages[:i], "tools": conversation.get("tools") or []}
            reply = json.dumps(message.get("content") or message.get("tool_calls") or "")
            entries.append(
                {
                    "ts": round(at, 3),
                    "blocks": list(request_blocks(body, block_bytes)),
                    "prompt_tokens": math.ceil(len(prompt_bytes(body)) / bytes_per_token),
                    "output_tokens": max(1, math.ceil(len(reply) / bytes_per_token)),
                    "session": conversation["id"],
                }
            )
            at += turn_gap_s
    yield from sorted(entries, key=lambda entry: entry["ts"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conversations", description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=Path, default=TAU_BENCH)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--bytes-per-token", type=float, default=4.0)
    parser.add_argument("--open-every-s", type=float, default=1.0)
    parser.add_argument("--turn-gap-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with args.conversations.open(encoding="utf-8") as lines:
        conversations = [json.loads(line) for line in lines if line.strip()]
    block_bytes = RoutingSpec().block_bytes
    entries = turns(
        conversations,
        block_bytes=block_bytes,
        bytes_per_token=args.bytes_per_token,
        open_every_s=args.open_every_s,
        turn_gap_s=args.turn_gap_s,
        seed=args.seed,
    )
    count = 0
    with args.out.open("w", encoding="utf-8") as out:
        for entry in entries:
            out.write(json.dumps(entry) + "\n")
            count += 1
    print(
        f"wrote {args.out}: {count} requests from {len(conversations)} conversations; "
        f"replay with --block-tokens {round(block_bytes / args.bytes_per_token)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
