"""The perfect-routing floor of the tau-bench replay, from the engine model's tokenizer.

    .venv-engine/bin/python -m tests.bench.tau_floor [--replicas 2]

Renders every request of `tests.bench.tau_routing` with the tiny model's chat template and
counts the prompt tokens vLLM would have to compute if every conversation stayed on one
replica with an unbounded cache: per turn, everything after the last whole KV block shared
with the conversation's previous turn (vLLM reuses whole blocks only), plus the shared
system + tools prefix once per replica. Prints the floor for several block sizes: what the
engine's block size costs every router alike. Runs in the engine environment (it needs
`transformers`), offline.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from transformers import AutoTokenizer

from engine.supervisor import ROOT
from tests.bench.tau_routing import conversations


def common_prefix(a: list[int], b: list[int]) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--max-context-chars", type=int, default=30_000)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    tokenizer: Any = AutoTokenizer.from_pretrained(str(ROOT / ".run" / "models" / "tiny"))
    prompts: list[list[list[int]]] = []
    for conv in conversations(args.conversations, args.max_context_chars):
        turns = []
        for turn in conv:
            tools = sorted(turn["tools"], key=lambda t: t["function"]["name"])
            text = tokenizer.apply_chat_template(
                turn["messages"],
                # as the gateway's canonicalizer sends them: keys sorted at every level
                tools=[json.loads(json.dumps(t, sort_keys=True)) for t in tools],
                add_generation_prompt=True,
                tokenize=False,
            )
            turns.append(tokenizer.encode(text, add_special_tokens=False))
        prompts.append(turns)
    total = sum(len(p) for turns in prompts for p in turns)
    shared = min(common_prefix(prompts[0][0], turns[0]) for turns in prompts)
    print(f"prompt tokens {total:,}; shared system + tools prefix {shared:,} tokens")
    print(f"{'block':>6} {'floor (uncached tokens)':>24}")
    for block in (16, 32, 64, 128):
        uncached = args.replicas * (shared // block) * block
        for turns in prompts:
            previous: list[int] | None = None
            for prompt in turns:
                held = common_prefix(previous, prompt) if previous else shared
                cached = min((held // block) * block, ((len(prompt) - 1) // block) * block)
                uncached += len(prompt) - cached
                previous = prompt
        print(f"{block:>6} {uncached:>24,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
