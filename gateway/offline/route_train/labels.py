"""Labelled prompts for training and scoring the tier router, RouteLLM-style JSONL: one
prompt a line, `source`, optional `subject`, `prompt`, and whether each tier answered it
right (`small_correct`/`large_correct`, booleans) or how well (`small_score`/`large_score`,
floats in [0, 1])."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class LabelError(ValueError):
    pass


@dataclass(frozen=True)
class LabeledPrompt:
    source: str
    group: str  # MMLU subject, else the source: the unit held out together
    prompt: str
    small_ok: float  # 1.0 right, 0.0 wrong, or a score in between
    large_ok: float

    @property
    def small_advantage(self) -> float:
        """The training target in [0, 1]: 1 small right and large wrong, 0.5 a tie."""
        return (self.small_ok - self.large_ok + 1.0) / 2.0


def read_labels(path: str | Path) -> list[LabeledPrompt]:
    prompts = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    prompts.append(_labeled(json.loads(line)))
                except (json.JSONDecodeError, LabelError, TypeError) as exc:
                    raise LabelError(f"{path}:{number}: {exc}") from exc
    if not prompts:
        raise LabelError(f"{path}: no labelled prompts")
    return prompts


def _labeled(record: Any) -> LabeledPrompt:
    if not isinstance(record, dict):
        raise LabelError("not a JSON object")
    source, prompt = record.get("source"), record.get("prompt")
    if not isinstance(source, str) or not isinstance(prompt, str):
        raise LabelError("needs string `source` and `prompt`")
    subject = record.get("subject")
    return LabeledPrompt(
        source=source,
        group=subject if isinstance(subject, str) and subject else source,
        prompt=prompt,
        small_ok=_outcome(record, "small"),
        large_ok=_outcome(record, "large"),
    )


def _outcome(record: dict[str, Any], tier: str) -> float:
    score = record.get(f"{tier}_score")
    if isinstance(score, int | float) and not isinstance(score, bool) and 0 <= score <= 1:
        return float(score)
    correct = record.get(f"{tier}_correct")
    if isinstance(correct, bool):
        return float(correct)
    raise LabelError(f"needs `{tier}_correct` (boolean) or `{tier}_score` (0..1)")
