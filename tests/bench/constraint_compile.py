"""Benchmark: what a client's structured-output constraint costs a real vLLM replica to
compile, at the gateway's bounds and past them, and what the gateway answers for each.

    make run    # in another terminal: 2 cpu-tiny replicas and the gateway on :8080
    .venv/bin/python -m tests.bench.constraint_compile [--engine URL] [--gateway URL]

Each constraint goes straight to one replica (the first in `.run/engine-state.json`
unless `--engine`) in vLLM's `structured_outputs` field with `max_tokens: 8`: the time is
mostly the engine's compile (xgrammar), since a plain request takes about 0.05 s. Then the
same request goes through the gateway, which refuses what is past its bounds
(gateway/untrusted/structured_outputs.py) before any engine is asked. Prints a table and
writes JSON. A benchmark, not a test: the engine's times are this machine's.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import httpx

from engine.supervisor import ROOT
from tests.bench.report import write_report

_GRAMMAR_RULES = 2_000  # about 50 KB: under the gateway's 64 KB bound


def _grammar(rules: int) -> str:
    body = "\n".join(f'r{i} ::= "a" r{i + 1} | "b"' for i in range(rules))
    return f'root ::= r0\n{body}\nr{rules} ::= "c"'


def _alternatives(count: int, chars: int | None = None) -> str:
    text = "|".join(f"w{i}x" for i in range(count))
    return text if chars is None else text[:chars].rsplit("|", 1)[0]


def cases() -> dict[str, dict[str, Any]]:
    return {
        "enum of 9,990 values (within)": {"json": {"enum": [f"v{i}" for i in range(9_990)]}},
        "enum of 100,000 values (past)": {"json": {"enum": [f"v{i}" for i in range(100_000)]}},
        "3,000 required properties (within)": {"json": _properties(3_000)},
        "20,000 required properties (past)": {"json": _properties(20_000)},
        "regex of 16 KB (within)": {"regex": _alternatives(3_000, 16_384)},
        "regex of 40,000 alternatives (past)": {"regex": _alternatives(40_000)},
        "grammar of 50 KB (within)": {"grammar": _grammar(_GRAMMAR_RULES)},
        "grammar of 640 KB (past)": {"grammar": _grammar(20_000)},
        "10,000 choices (within)": {"choice": [f"c{i}" for i in range(10_000)]},
    }


def _properties(count: int) -> dict[str, Any]:
    names = [f"p{i}" for i in range(count)]
    return {
        "type": "object",
        "properties": {name: {"type": "integer"} for name in names},
        "required": names,
    }


def _post(base: str, constraint: dict[str, Any], timeout_s: float) -> tuple[int | str, float]:
    body = {
        "model": "tiny",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "structured_outputs": constraint,
    }
    started = time.perf_counter()
    try:
        status: int | str = httpx.post(
            f"{base}/v1/chat/completions", json=body, timeout=timeout_s
        ).status_code
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    return status, round(time.perf_counter() - started, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine", help="a replica's URL (default: make run's first)")
    parser.add_argument("--gateway", default="http://127.0.0.1:8080")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--out", default=str(ROOT / ".run" / "bench" / "constraint-compile.json"))
    args = parser.parse_args()
    engine = args.engine
    if engine is None:
        state = json.loads((ROOT / ".run" / "engine-state.json").read_text())
        engine = next(r["url"] for r in state["replicas"] if r["pool"] == "tiny-chat")
    rows = []
    print(
        f"{'constraint':40} {'engine status':>13} {'engine s':>9} {'gateway':>8} {'gateway s':>9}"
    )
    for name, constraint in cases().items():
        engine_status, engine_s = _post(engine, constraint, args.timeout_s)
        gateway_status, gateway_s = _post(args.gateway, constraint, args.timeout_s)
        rows.append(
            {"constraint": name, "engine_status": engine_status, "engine_s": engine_s,
             "gateway_status": gateway_status, "gateway_s": gateway_s}
        )  # fmt: skip
        print(
            f"{name:40} {engine_status!s:>13} {engine_s:9.2f} {gateway_status!s:>8} {gateway_s:9.3f}",
            flush=True,
        )
    write_report({"engine": engine, "gateway": args.gateway, "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
