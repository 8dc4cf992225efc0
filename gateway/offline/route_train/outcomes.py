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

Three kinds of label, in this order of trust, one per line:

- the cascade's checks on the first answer (`cascade`: passed, or escalated / failed);
- the tool-call checks on the first answer that called tools (`tool_check`: valid, or
  invalid: it was repaired, asked again, escalated or refused; gateway/toolcalls/);
- explicit feedback (`POST /v1/feedback`, joined in by `gateway dataset export`), only
  when a pass mark is given: an answer of that tier whose mean score reaches it passed.

Only answers of the tier asked for count (the small one); other lines (no label, no kept
text, another tier) are skipped and counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gateway.offline.log_lines import LogLineError, read_entries
from gateway.offline.route_train.labels import LabeledPrompt, LabelError
from gateway.offline.route_train.ranking import auc
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
TOOL_CHECKS = frozenset({"valid", "invalid"})
# The small tier's chance of passing its checks, read from everything.
PASSES = Head(lambda p: p.small_ok, reads_words=True, numeric=NUMERIC_NAMES)
# Chosen on a stream of the protocol's design-part MMLU subjects (1,000 one-sided outcomes,
# three orders; docs/benchmarks/tiers.md): word penalties 1e-2 to 1e-6 and no words; the
# traffic learned from is the traffic routed, so its words count for more than across
# subjects, and a light penalty let them.
IN_DOMAIN = TrainConfig(words=True, l2_hashed=1e-5)
# What a route's own outcomes choose between (`select_learner`): whether its words carry
# is a property of its traffic (across MMLU subjects they did, on a stream of one kind of
# prompt they may only add noise), and the outcomes are the only labels a route has.
LEARNERS: tuple[tuple[str, TrainConfig], ...] = (
    ("words, light penalty", IN_DOMAIN),
    ("words, default penalty", TrainConfig(words=True)),
    ("counts only", TrainConfig()),
)
SELECTION_FOLDS = 5


@dataclass(frozen=True)
class Outcomes:
    prompts: list[LabeledPrompt]  # small_ok: passed; large_ok unknown (set to 1)
    skipped: int


def outcomes_of(
    entries: Iterable[dict[str, Any]],
    tier: str | None = None,
    *,
    feedback_pass: float | None = None,
) -> Outcomes:
    """The learning examples in request-log (or dataset-export) entries: answers of `tier`
    (any tier when None) with a label and the router's text kept. The group is the
    entry's model alias."""
    prompts: list[LabeledPrompt] = []
    skipped = 0
    for entry in entries:
        text = entry.get("route_text")
        passed = _label(entry, tier, feedback_pass)
        if not isinstance(text, str) or not text or passed is None:
            skipped += 1
            continue
        model = entry.get("model")
        group = model if isinstance(model, str) and model else "traffic"
        prompts.append(LabeledPrompt("traffic", group, text, 1.0 if passed else 0.0, 1.0))
    return Outcomes(prompts, skipped)


def _label(entry: dict[str, Any], tier: str | None, feedback_pass: float | None) -> bool | None:
    def on(field: str) -> bool:
        return tier is None or entry.get(field) == tier

    if entry.get("cascade") in CHECKED and on("cascade_tier"):
        return bool(entry["cascade"] == PASSED)
    if entry.get("tool_check") in TOOL_CHECKS and on("tool_check_tier"):
        return bool(entry["tool_check"] == "valid")
    scores = entry.get("feedback")
    if feedback_pass is not None and isinstance(scores, list) and scores and on("tier"):
        values = [s["score"] for s in scores if isinstance(s, dict)]
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        if numbers:
            return sum(numbers) / len(numbers) >= feedback_pass
    return None


def read_log(
    path: str | Path, tier: str | None = None, *, feedback_pass: float | None = None
) -> Outcomes:
    try:
        return outcomes_of(read_entries(path), tier, feedback_pass=feedback_pass)
    except LogLineError as exc:
        raise LabelError(str(exc)) from exc


@dataclass(frozen=True)
class Selection:
    name: str
    config: TrainConfig
    aucs: dict[str, float | None]  # each learner's cross-validated AUC on the outcomes


def select_learner(
    prompts: Sequence[LabeledPrompt],
    learners: Sequence[tuple[str, TrainConfig]] = LEARNERS,
    folds: int = SELECTION_FOLDS,
    designs: dict[int, Design] | None = None,
) -> Selection:
    """The learner whose scores rank these outcomes best when each is held out in turn
    (`folds` folds, a fixed shuffle): the first listed on a tie, or when none can be
    judged (too few of one outcome). `designs`: the prompts' features by hash size,
    extracted here where missing (the caller's to reuse)."""
    passed = np.array([p.small_ok >= 0.5 for p in prompts], dtype=np.float64)
    order = np.random.default_rng(0).permutation(len(prompts))
    designs = {} if designs is None else designs
    aucs: dict[str, float | None] = {}
    for name, config in learners:
        design = _design(prompts, config, designs)
        head = replace(PASSES, reads_words=config.words)
        scores = np.zeros(len(prompts))
        for fold in range(folds):
            held = np.sort(order[fold::folds])
            kept = np.sort(np.setdiff1d(order, held))
            model = fit_head(design.take(kept), [prompts[i] for i in kept], head, config)
            scores[held] = model.logits(design.take(held))
        aucs[name] = auc(scores, passed)
    best = max(learners, key=lambda item: aucs[item[0]] or 0.0)  # max keeps the first of ties
    return Selection(best[0], best[1], aucs)


def train_from_outcomes(
    prompts: Sequence[LabeledPrompt],
    config: TrainConfig | None = None,
    *,
    trained_on: str = "request log",
    progress: Progress | None = None,
) -> LearnedRouter:
    """A router whose score is the small tier's chance of passing its checks. `config`
    None: the learner the outcomes choose (`select_learner`)."""
    if not prompts:
        raise LabelError("no labelled answers with their text in the log")
    passed = sum(p.small_ok for p in prompts)
    if passed in (0, len(prompts)):
        raise LabelError(
            f"all {len(prompts)} labelled answers {'passed' if passed else 'failed'}: "
            "nothing to tell them apart by"
        )
    notes = {"heads": "passes its checks (one-sided outcomes)"}
    designs: dict[int, Design] = {}  # features extracted once, for selection and the fit
    if config is None:
        selection = select_learner(prompts, designs=designs)
        config = selection.config
        judged = ", ".join(
            f"{name} {'-' if value is None else f'{value:.3f}'}"
            for name, value in selection.aucs.items()
        )
        notes["learner"] = f"{selection.name} (cross-validated AUC: {judged})"
        if progress:
            progress(f"learner: {notes['learner']}")
    design = _design(prompts, config, designs)
    model = fit_head(design, prompts, replace(PASSES, reads_words=config.words), config)
    if progress:
        progress(f"trained on {len(prompts)} checked answers, {int(passed)} passed")
    router = router_of(model, config, trained_on=f"{trained_on}: {len(prompts)} outcomes")
    return replace(router, notes=notes)


def _design(
    prompts: Sequence[LabeledPrompt], config: TrainConfig, designs: dict[int, Design]
) -> Design:
    """The prompts' features at the config's hash size, extracted once per size."""
    bits = config.hash_bits
    if bits not in designs:
        designs[bits] = Design.of([p.prompt for p in prompts], bits)
    return designs[bits]
