"""Learning the tier router from the gateway's own traffic (`gateway route-train --from-log`).

A request the cascade sent to a lower tier first had that tier's answer checked; the
request log says how it went (`cascade`: passed, escalated or failed; `cascade_tier`: whose
answer) and, where the policy and the tenant allow keeping content, what the router reads
of the prompt (`route_text`). That is a label nobody had to write: whether the small tier
was good enough for this prompt, by the checks the operator trusts. It is one-sided (what
the large tier would have done is never seen), so the router learned from it predicts one
thing, the small tier's chance of passing, from words and counts alike: the traffic it
learns from is the traffic it will route, so its words mean something here (across MMLU
subjects they did not; gateway/offline/route_train/train.py).

Only requests whose first checked tier is the route's lowest count; other lines (no
checks, no kept text, another tier, an error before any answer) are skipped and counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway.offline.route_train.labels import LabeledPrompt, LabelError
from gateway.offline.route_train.train import (
    Design,
    Head,
    Progress,
    TrainConfig,
    fit_head,
    router_of,
)
from gateway.tiering.features import NUMERIC_NAMES
from gateway.tiering.learned import LearnedRouter

PASSED = "passed"
CHECKED = frozenset({PASSED, "escalated", "failed"})
# The small tier's chance of passing its checks, read from everything.
PASSES = Head(lambda p: p.small_ok, reads_words=True, numeric=NUMERIC_NAMES)
# Chosen on a stream of the protocol's design-part MMLU subjects (1,000 one-sided outcomes,
# three orders; docs/benchmarks/tiers.md): word penalties 1e-2 to 1e-6 and no words; the
# traffic learned from is the traffic routed, so its words count for more than across
# subjects, and a light penalty let them.
IN_DOMAIN = TrainConfig(words=True, l2_hashed=1e-5)


@dataclass(frozen=True)
class Outcomes:
    prompts: list[LabeledPrompt]  # small_ok: passed; large_ok unknown (set to 1)
    skipped: int


def outcomes_of(entries: Iterable[dict[str, Any]], tier: str | None = None) -> Outcomes:
    """The learning examples in request-log entries: checked first on `tier` (any tier
    when None), with the router's text kept. The group is the entry's model alias."""
    prompts: list[LabeledPrompt] = []
    skipped = 0
    for entry in entries:
        text, cascade = entry.get("route_text"), entry.get("cascade")
        first = entry.get("cascade_tier")
        if not isinstance(text, str) or not text or cascade not in CHECKED:
            skipped += 1
            continue
        if tier is not None and first != tier:
            skipped += 1
            continue
        model = entry.get("model")
        group = model if isinstance(model, str) and model else "traffic"
        passed = 1.0 if cascade == PASSED else 0.0
        prompts.append(LabeledPrompt("traffic", group, text, passed, 1.0))
    return Outcomes(prompts, skipped)


def read_log(path: str | Path, tier: str | None = None) -> Outcomes:
    entries: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise LabelError(f"{path}:{number}: not JSON ({exc})") from exc
            if isinstance(entry, dict):
                entries.append(entry)
    return outcomes_of(entries, tier)


def train_from_outcomes(
    prompts: Sequence[LabeledPrompt],
    config: TrainConfig = IN_DOMAIN,
    *,
    trained_on: str = "request log",
    progress: Progress | None = None,
) -> LearnedRouter:
    """A router whose score is the small tier's chance of passing its checks."""
    if not prompts:
        raise LabelError("no checked answers with their text in the log")
    passed = sum(p.small_ok for p in prompts)
    if passed in (0, len(prompts)):
        raise LabelError(
            f"all {len(prompts)} checked answers {'passed' if passed else 'failed'}: "
            "nothing to tell them apart by"
        )
    design = Design.of([p.prompt for p in prompts], config.hash_bits)
    model = fit_head(design, prompts, replace(PASSES, reads_words=config.words), config)
    if progress:
        progress(f"trained on {len(prompts)} checked answers, {int(passed)} passed")
    router = router_of(model, config, trained_on=f"{trained_on}: {len(prompts)} outcomes")
    return replace(router, notes={"heads": "passes its checks (one-sided outcomes)"})
