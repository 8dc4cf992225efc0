"""`gateway trim-eval`: replay agent conversations turn by turn through the gateway's real
session and trimming code, and measure what trimming saved and what it kept.

The request of each assistant turn is every message before it (what the agent would
send); the reply stored is the recorded assistant message. Figures, per the issue:

- history_peak_ratio: over conversations whose untrimmed history (after system prompt and
  tools) passes the high-water mark, sum of largest trimmed histories over sum of largest
  untrimmed ones (tokens);
- prompt_tokens_ratio: all prompt tokens sent (tools included), trimmed over untrimmed;
- uncached_prefill_ratio: tokens a prefix cache (16-token blocks, one cache per
  conversation holding every earlier turn) would compute, trimmed over untrimmed;
- structural_validity: share of contexts sent that pass the validity checks;
- state_retention: share of the fields of each entity's latest snapshot recoverable from
  the context sent (compacted state, whole snapshots and patches applied in order);
- user_retention: share of the user's messages whose text reaches the engine verbatim;
- recent_output_retention: share of each request's last three tool outputs (of tools that
  are not declared state tools, which state_retention covers) that reach the engine
  verbatim: what the agent just read, which trimming that ignores meaning loses first.
The same figures for a last-N-messages window are the baseline.

Conversations are split by the evaluation protocol (gateway/offline/protocol.py): by
default the figures are given for the design part (where watermarks and the like are
chosen) and the report part (the one a document quotes), never pooled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import numpy as np
import orjson

from gateway.chat.messages import Message
from gateway.chat.replies import normalise
from gateway.offline.protocol import PARTS, conversation_group, split
from gateway.policy.sessions import TrimmingSpec
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import MemoryCheckpoints
from gateway.sessions.turns import SessionTurns
from gateway.trimming.conversation import latest_states, problems, snapshot_of, tool_results
from gateway.trimming.tokens import TokenCounter, message_text
from gateway.trimming.trim import PATCH_MARK, Trimmer

CACHE_BLOCK = 16
FIGURES = (
    "history_peak_ratio",
    "prompt_tokens_ratio",
    "uncached_prefill_ratio",
    "structural_validity",
    "state_retention",
    "user_retention",
    "recent_output_retention",
)
RECENT_OUTPUTS = 3  # Anthropic's context editing keeps the last 3 tool uses by default


@dataclass
class Tally:
    """Running totals for one way of building contexts (trimmed, or the baseline)."""

    prompt_tokens: int = 0
    uncached_tokens: int = 0
    valid: int = 0
    contexts: int = 0
    state_fields: int = 0
    state_kept: int = 0
    user_messages: int = 0
    user_kept: int = 0
    recent_outputs: int = 0
    recent_kept: int = 0
    peaks: list[int] = field(default_factory=list)  # largest history per conversation

    def figures(self) -> dict[str, float | None]:
        return {
            "structural_validity": round(self.valid / max(1, self.contexts), 4),
            # None where no state tools are declared (or none was called): nothing to keep.
            "state_retention": (
                round(self.state_kept / self.state_fields, 4) if self.state_fields else None
            ),
            "user_retention": round(self.user_kept / max(1, self.user_messages), 4),
            "recent_output_retention": (
                round(self.recent_kept / self.recent_outputs, 4) if self.recent_outputs else None
            ),
        }


class Evaluation:
    def __init__(self, spec: TrimmingSpec, tokens: TokenCounter, window: int) -> None:
        self.spec = spec
        self.tokens = tokens
        self.window = window
        self.trimmer = Trimmer(spec, tokens)

    def run(self, conversations: Iterable[dict[str, Any]]) -> dict[str, Any]:
        return asyncio.run(self._run(list(conversations)))

    async def _run(self, conversations: list[dict[str, Any]]) -> dict[str, Any]:
        untrimmed, trimmed, window = Tally(), Tally(), Tally()
        turns_total = 0
        for number, record in enumerate(conversations):
            sequences: dict[str, list[np.ndarray[Any, Any]]] = {"u": [], "t": [], "w": []}
            peaks = {"u": 0, "t": 0, "w": 0}
            tools_tokens = self.tokens.count(orjson.dumps(record.get("tools") or []).decode())
            turns = SessionTurns(MemoryCheckpoints(), self.trimmer)
            # A fixed name: it appears in the compacted block, so the figures stay exact.
            session = SessionRef("eval", f"conversation-{number}")
            messages = [normalise(m) for m in record["messages"]]
            for i, message in enumerate(messages):
                if message.get("role") != "assistant" or i == 0:
                    continue
                turns_total += 1
                full = messages[:i]
                body = {"model": "eval", "messages": full, "tools": record.get("tools")}
                turn, sent = await turns.begin(session, "full", body)
                engine = sent["messages"]
                await turns.commit(
                    turn, engine_body=sent, reply=message, usage=None, route={},
                    request_id=str(i), model="eval",
                )  # fmt: skip
                naive = _last_n(full, self.window)
                for key, context, tally in (
                    ("u", full, untrimmed),
                    ("t", engine, trimmed),
                    ("w", naive, window),
                ):
                    history = self.trimmer.history_tokens(context)
                    peaks[key] = max(peaks[key], history)
                    self._account(tally, full, context, tools_tokens, sequences[key])
            for key, tally in (("u", untrimmed), ("t", trimmed), ("w", window)):
                tally.peaks.append(peaks[key])
        return self._report(untrimmed, trimmed, window, len(conversations), turns_total)

    def _account(
        self,
        tally: Tally,
        full: list[Message],
        context: list[Message],
        tools_tokens: int,
        earlier: list[np.ndarray[Any, Any]],
    ) -> None:
        sequence = np.array(
            [t for m in context for t in self.tokens.encode(message_text(m))], dtype=np.int64
        )
        tally.contexts += 1
        tally.valid += not problems(context)
        tally.prompt_tokens += (
            tools_tokens
            + self.trimmer.history_tokens(context)
            + sum(
                self.tokens.count(message_text(m)) + 4 for m in context if m.get("role") == "system"
            )
        )
        held = max((_common_prefix(sequence, s) for s in earlier), default=0)
        tally.uncached_tokens += len(sequence) - (held // CACHE_BLOCK) * CACHE_BLOCK
        earlier.append(sequence)
        fields, kept = self._state_retention(full, context)
        tally.state_fields += fields
        tally.state_kept += kept
        recent = self._recent_outputs(full)
        sent = {m.get("content") for m in context if m.get("role") == "tool"}
        tally.recent_outputs += len(recent)
        tally.recent_kept += sum(content in sent for content in recent)
        texts = _texts(context)
        for message in full:
            if message.get("role") == "user":
                tally.user_messages += 1
                # Every text of the message (one, or each of its content parts) verbatim.
                wanted = _texts([message])
                tally.user_kept += bool(wanted) and all(
                    any(part in t for t in texts) for part in wanted
                )

    def _recent_outputs(self, full: list[Message]) -> list[str]:
        state_tools = self.spec.state_tools
        outputs = [
            content
            for index, result in tool_results(full).items()
            if result.name not in state_tools
            and isinstance(content := full[index].get("content"), str)
            and content
        ]
        return outputs[-RECENT_OUTPUTS:]

    def _state_retention(self, full: list[Message], context: list[Message]) -> tuple[int, int]:
        latest = latest_states(full, self.spec.state_tools)
        recovered = _recover_states(context, self.spec)
        fields = kept = 0
        for entity, state in latest.items():
            want = dict(_leaves(state))
            have = dict(_leaves(recovered.get(entity, {})))
            fields += len(want)
            kept += sum(1 for path, value in want.items() if have.get(path, _MISSING) == value)
        return fields, kept

    def _report(
        self, untrimmed: Tally, trimmed: Tally, window: Tally, conversations: int, turns: int
    ) -> dict[str, Any]:
        over = [
            (u, t, w)
            for u, t, w in zip(untrimmed.peaks, trimmed.peaks, window.peaks, strict=True)
            if u > self.spec.high_water_tokens
        ]
        untrimmed_peaks = sum(u for u, _, _ in over)

        def side(tally: Tally, peak_index: int) -> dict[str, Any]:
            peaks = sum(row[peak_index] for row in over)
            return {
                "history_peak_ratio": round(peaks / max(1, untrimmed_peaks), 4),
                "prompt_tokens_ratio": round(
                    tally.prompt_tokens / max(1, untrimmed.prompt_tokens), 4
                ),
                "uncached_prefill_ratio": round(
                    tally.uncached_tokens / max(1, untrimmed.uncached_tokens), 4
                ),
                **tally.figures(),
                "prompt_tokens": tally.prompt_tokens,
                "uncached_tokens": tally.uncached_tokens,
            }

        return {
            "conversations": conversations,
            "turns": turns,
            "conversations_over_high_water": len(over),
            "high_water_tokens": self.spec.high_water_tokens,
            "low_water_tokens": self.spec.low_water_tokens,
            "tokens": self.tokens.name,
            **side(trimmed, 1),
            "untrimmed": {
                "prompt_tokens": untrimmed.prompt_tokens,
                "uncached_tokens": untrimmed.uncached_tokens,
                **untrimmed.figures(),
            },
            "baseline_last_n": {"messages": self.window, **side(window, 2)},
        }


_MISSING = object()


def _last_n(messages: list[Message], n: int) -> list[Message]:
    start = 0
    while start < len(messages) and messages[start].get("role") in ("system", "developer"):
        start += 1
    return [*messages[:start], *messages[start:][-n:]]


def _common_prefix(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _texts(context: list[Message]) -> list[str]:
    texts: list[str] = []
    for message in context:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return texts


def _recover_states(context: list[Message], spec: TrimmingSpec) -> dict[str, dict[str, Any]]:
    """What a reader of the context can know of each entity: the compacted block's states,
    then whole snapshots and patches in order."""
    states: dict[str, dict[str, Any]] = {}
    results = tool_results(context)
    for index, message in enumerate(context):
        for text in _texts([message]):
            for line in text.splitlines():
                _apply_block_line(line, states)
        if index not in results:
            continue
        content = message.get("content")
        if isinstance(content, str) and _apply_patch_text(content, states):
            continue
        snapshot, _ = snapshot_of(results[index], content, spec.state_tools)
        if snapshot is not None:
            states[snapshot.entity] = snapshot.state
    return states


def _apply_patch_text(text: str, states: dict[str, dict[str, Any]]) -> bool:
    """Apply a patch as trimming writes it (`PATCH_MARK` E ...: [ops]); False if `text` is
    not one."""
    if not text.startswith(PATCH_MARK):
        return False
    entity = text[len(PATCH_MARK) :].split(" ", 1)[0]
    if entity in states:
        ops = orjson.loads(text[text.index(": [") + 2 :])
        states[entity] = jsonpatch.apply_patch(states[entity], ops)
    return True


def _apply_block_line(line: str, states: dict[str, dict[str, Any]]) -> None:
    """A compacted block's `state E = {...}` and `state JSON Patch ... of E ...` lines."""
    if not line.startswith("state "):
        return
    rest = line[len("state ") :]
    if _apply_patch_text(rest, states):
        return
    entity, sep, raw = rest.partition(" = ")
    if sep:
        with contextlib.suppress(orjson.JSONDecodeError):
            states[entity] = orjson.loads(raw)


def _leaves(value: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, f"{path}/{key}")
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}/{i}")
    else:
        yield path, value


def evaluate(
    spec: TrimmingSpec,
    tokens: TokenCounter,
    records: list[dict[str, Any]],
    *,
    window: int,
    part: str = "both",
) -> dict[str, Any]:
    """The figures for one part of the protocol (`design`, `report`), for every
    conversation (`all`), or for each part apart (`both`, the default)."""
    if part == "all":
        return {"part": "all", **Evaluation(spec, tokens, window).run(records)}
    parts = split(enumerate(records), lambda row: conversation_group(row[1], row[0]))
    results: dict[str, dict[str, Any]] = {
        name: Evaluation(spec, tokens, window).run(record for _, record in parts[name])
        for name in PARTS
        if part in ("both", name)
    }
    if part != "both":
        return {"part": part, **results[part]}
    return {"part": "both", "parts": results}


def table(result: dict[str, Any]) -> str:
    """One column per part (and the report part's last-N baseline), else the gateway
    beside the baseline."""
    if result["part"] != "both":
        return "\n".join([_heading(result["part"], result), *_rows(result)])
    design, report = result["parts"]["design"], result["parts"]["report"]
    return "\n".join(
        [
            _heading("design", design),
            _heading("report", report),
            f"{'figure':<24} {'design':>9} {'report':>9} "
            f"{'report, last ' + str(report['baseline_last_n']['messages']):>17}",
            *(
                f"{key:<24} {_cell(design[key]):>9} {_cell(report[key]):>9} "
                f"{_cell(report['baseline_last_n'][key]):>17}"
                for key in FIGURES
            ),
        ]
    )


def _heading(part: str, r: dict[str, Any]) -> str:
    return (
        f"{part}: {r['conversations']} conversations, {r['turns']} turns, "
        f"{r['conversations_over_high_water']} over the high-water mark "
        f"({r['high_water_tokens']} tokens; counted with {r['tokens']})"
    )


def _rows(result: dict[str, Any]) -> list[str]:
    base = result["baseline_last_n"]
    lines = [f"{'figure':<24} {'gateway':>9} {'last ' + str(base['messages']) + ' msgs':>12}"]
    lines += [f"{k:<24} {_cell(result[k]):>9} {_cell(base[k]):>12}" for k in FIGURES]
    return lines


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
