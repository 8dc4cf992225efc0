"""The Anthropic Messages API: translated by the gateway to Chat Completions, or passed
through to vLLM's own `/v1/messages`? Measured on the tau-bench airline conversations,
re-told as Anthropic requests (system, tools, tool_use and tool_result blocks), every
assistant turn of each.

1. The gateway's translation CPU per request (request in, whole answer out), against the
   size of the request.
2. On one real `cpu-tiny` replica, each turn asked both ways with `max_tokens: 1`: vLLM's
   own `/v1/messages`, and `/v1/chat/completions` with the gateway's translation. Reported:
   whether the engine saw the same prompt (its prompt token count), and the engine's
   latency each way, as a ratio (vLLM's own endpoint translates too, in the engine's
   process).

    .venv/bin/python -m tests.bench.anthropic_translation [--conversations 8] [--out FILE]

Prints a table and writes JSON (default .run/bench/anthropic-translation.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from engine.supervisor import ROOT
from gateway.anthropic.answer import message_object
from gateway.anthropic.convert import chat_request
from tests.bench.tau_routing import conversations, start_engines


def anthropic_request(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat request body (OpenAI shapes) as the Anthropic request a client would send."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for message in chat["messages"]:
        role = message["role"]
        if role == "system":
            system.append(message["content"])
        elif role == "tool":
            result = {"type": "tool_result", "tool_use_id": message["tool_call_id"],
                      "content": message["content"]}  # fmt: skip
            last = messages[-1] if messages else None
            if last and last["role"] == "user" and isinstance(last["content"], list):
                last["content"].append(result)
            else:
                messages.append({"role": "user", "content": [result]})
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if message.get("content"):
                blocks.append({"type": "text", "text": message["content"]})
            for call in message.get("tool_calls") or ():
                blocks.append({"type": "tool_use", "id": call["id"],
                               "name": call["function"]["name"],
                               "input": json.loads(call["function"]["arguments"] or "{}")})  # fmt: skip
            messages.append({"role": "assistant", "content": blocks})
        else:
            messages.append({"role": "user", "content": message["content"]})
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "input_schema": t["function"]["parameters"]} for t in chat["tools"]]  # fmt: skip
    return {"model": "tiny", "max_tokens": 1, "system": "\n".join(system),
            "messages": messages, "tools": tools}  # fmt: skip


def translation_us(request: dict[str, Any], rounds: int = 50) -> float:
    """The gateway's own work for one request: parse, translate, serialise; the answer back."""
    raw = orjson.dumps(request)
    completion = {"choices": [{"index": 0, "finish_reason": "stop",
                               "message": {"role": "assistant", "content": "ok"}}],
                  "usage": {"prompt_tokens": 900, "completion_tokens": 1}}  # fmt: skip
    started = time.perf_counter()
    for _ in range(rounds):
        body = chat_request(orjson.loads(raw)).body
        orjson.dumps(body)
        orjson.dumps(message_object("msg_1", request, completion, False))
    return (time.perf_counter() - started) / rounds * 1e6


def timed_post(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    answer = client.post(path, json=body)
    elapsed = time.perf_counter() - started
    answer.raise_for_status()
    return elapsed, answer.json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--max-context-chars", type=int, default=30_000)
    parser.add_argument(
        "--out", default=str(ROOT / ".run" / "bench" / "anthropic-translation.json")
    )
    args = parser.parse_args()
    turns = [anthropic_request(t) for c in conversations(args.conversations,
             args.max_context_chars) for t in c]  # fmt: skip
    print(f"{len(turns)} turns of {args.conversations} tau-bench conversations", flush=True)
    cpu = [(len(orjson.dumps(t)), translation_us(t)) for t in turns]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work:
        print("starting 2 cpu-tiny replicas (about a minute)...", flush=True)
        for engines in start_engines(Path(work)):
            with httpx.Client(base_url=engines.urls[0], timeout=120) as engine:
                for i, turn in enumerate(turns):
                    chat = chat_request(turn).body
                    chat["model"] = "tiny"
                    # each way twice, the second timed: both read a warm prefix cache
                    for _ in range(2):
                        native_s, native = timed_post(engine, "/v1/messages", turn)
                        ours_s, ours = timed_post(engine, "/v1/chat/completions", chat)
                    native_prompt = sum(native["usage"].get(k) or 0 for k in (
                        "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))  # fmt: skip
                    rows.append({"native_s": native_s, "translated_s": ours_s,
                                 "native_prompt": native_prompt,
                                 "translated_prompt": ours["usage"]["prompt_tokens"]})  # fmt: skip
                    print(f"  turn {i + 1}/{len(turns)}", end="\r", flush=True)
            break
    same = sum(r["native_prompt"] == r["translated_prompt"] for r in rows)
    native_p50 = statistics.median(r["native_s"] for r in rows)
    ours_p50 = statistics.median(r["translated_s"] for r in rows)
    result = {
        "turns": len(turns),
        "request_bytes_median": statistics.median(size for size, _ in cpu),
        "translation_us_median": statistics.median(us for _, us in cpu),
        "translation_us_max": max(us for _, us in cpu),
        "same_prompt_tokens": same,
        "prompt_token_difference_max": max(
            abs(r["native_prompt"] - r["translated_prompt"]) for r in rows
        ),
        "engine_p50_s_native_messages": native_p50,
        "engine_p50_s_chat_translated": ours_p50,
        "native_over_translated_p50": native_p50 / ours_p50,
    }
    print()
    print("| figure | value |\n|---|---|")
    for name, value in result.items():
        print(f"| {name} | {value:.4g} |" if isinstance(value, float) else f"| {name} | {value} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"result": result, "rows": rows}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
