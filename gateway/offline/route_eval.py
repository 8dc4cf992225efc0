"""`gateway route-eval`: how much traffic the learned router sends to the small tier, and at
what cost in quality, measured per source on prompts it was not trained on.

Routing a prompt small means its quality is the small tier's label, else the large one's.
Per source (thresholds are swept within a source, small when score >= threshold):

- small_share_at_95: the largest share sent small while mean quality stays at least 95%
  of always-large quality;
- apgr: RouteLLM's average performance gap recovered: the quality curve over the share of
  large calls, at the 0%, 10%, ..., 100% quantiles of the score, integrated (trapezoids)
  and scaled so always-small is 0 and always-large 1 (random routing scores about 0.5);
- random_small_share_at_95: random routing's share, s * small + (1 - s) * large = 0.95 *
  large solved for s; oracle_small_share_at_95: ranking by the labels themselves;
- decision_p99_us: the 99th percentile of one decision from the prompt text (the policy's
  rules if given, then features and score), timed per prompt.

By default the figures are held out: the labels are split by group (MMLU subject; the
source when a row has none, so all of GSM8K is one group) and every prompt is scored by a
model trained without its group. With `artifact`, an existing router is scored as it is,
which is only honest on labels it never saw. The report says which.

A `fixed_tier` hook (the policy's rules) forces "small" or "large" for the prompts it
decides; only the others are ranked by the score.

The evaluation protocol (gateway/offline/protocol.py) splits the groups into a design part
and a report part, and by default both are reported apart: the design part held out by
group within itself (the figure choices may look at), and the report part scored by one
model trained on the whole design part (the figure a document quotes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.offline.protocol import PARTS, split
from gateway.offline.replay.sim import percentile
from gateway.offline.route_train.labels import LabeledPrompt
from gateway.offline.route_train.train import (
    Design,
    Progress,
    TrainConfig,
    Vector,
    fit,
    held_out_logits,
    router_of,
)
from gateway.tiering.learned import LearnedRouter

QUALITY_KEPT = 0.95
APGR_POINTS = 10

FixedTier = Callable[[str], str | None]
Decide = Callable[[str], float]

# Forced tiers, as stored per prompt.
FREE, FORCED_SMALL, FORCED_LARGE = 0, 1, -1


@dataclass(frozen=True)
class Sweep:
    """Small share and mean quality at every distinct threshold, from none small up."""

    small_shares: Vector
    qualities: Vector


def quality_sweep(
    scores: Vector, small: Vector, large: Vector, forced: Vector | None = None
) -> Sweep:
    forced = np.zeros(len(scores)) if forced is None else forced
    n = len(scores)
    free = np.nonzero(forced == FREE)[0]
    base = float(np.where(forced == FORCED_SMALL, small, large).sum())
    order = free[np.argsort(-scores[free], kind="stable")]
    gained = np.concatenate([[0.0], np.cumsum((small - large)[order])])
    ranked = scores[order]
    # A threshold moves a whole run of equal scores at once.
    ends = np.concatenate([[0], np.nonzero(ranked[1:] != ranked[:-1])[0] + 1, [len(order)]])
    ends = np.unique(ends)
    forced_small = int(np.sum(forced == FORCED_SMALL))
    return Sweep((forced_small + ends) / n, (base + gained[ends]) / n)


def small_share_at(
    scores: Vector,
    small: Vector,
    large: Vector,
    kept: float = QUALITY_KEPT,
    forced: Vector | None = None,
) -> float:
    sweep = quality_sweep(scores, small, large, forced)
    meets = sweep.qualities >= kept * float(large.mean()) - 1e-12
    return float(sweep.small_shares[meets].max()) if meets.any() else 0.0


def random_small_share_at(small: Vector, large: Vector, kept: float = QUALITY_KEPT) -> float:
    small_q, large_q = float(small.mean()), float(large.mean())
    if large_q <= small_q:
        return 1.0
    return float(np.clip((1 - kept) * large_q / (large_q - small_q), 0.0, 1.0))


def oracle_small_share_at(small: Vector, large: Vector, kept: float = QUALITY_KEPT) -> float:
    return small_share_at(small - large, small, large, kept)


def apgr(
    scores: Vector,
    small: Vector,
    large: Vector,
    points: int = APGR_POINTS,
    forced: Vector | None = None,
) -> float | None:
    """RouteLLM's APGR (routellm/evals): thresholds at the score's quantiles, large when
    the score is at or below one (strictly below the lowest, so one point has no large
    call), quality integrated over the share of large calls. None when the tiers tie."""
    forced = np.zeros(len(scores)) if forced is None else forced
    small_q, large_q = float(small.mean()), float(large.mean())
    free = forced == FREE
    if large_q == small_q or not free.any():
        return None
    thresholds = np.quantile(scores[free], np.linspace(0, 1, points + 1))
    curve = []
    for i, threshold in enumerate(thresholds):
        to_large = scores < threshold if i == 0 else scores <= threshold
        to_large = np.where(free, to_large, forced == FORCED_LARGE)
        curve.append((float(to_large.mean()), float(np.where(to_large, large, small).mean())))
    curve.sort()
    shares = np.array([c[0] for c in curve])
    quality = np.array([c[1] for c in curve])
    span = shares[-1] - shares[0]
    if span <= 0:
        return None
    area = float(np.sum((quality[1:] + quality[:-1]) * np.diff(shares)) / 2)
    return float((area - small_q * span) / ((large_q - small_q) * span))


def source_figures(
    scores: Vector, small: Vector, large: Vector, forced: Vector, decision_us: Vector
) -> dict[str, Any]:
    pgr = apgr(scores, small, large, forced=forced)
    return {
        "n": len(scores),
        "always_small_quality": round(float(small.mean()), 4),
        "always_large_quality": round(float(large.mean()), 4),
        "small_share_at_95": round(small_share_at(scores, small, large, forced=forced), 4),
        "apgr": None if pgr is None else round(pgr, 4),
        "random_small_share_at_95": round(random_small_share_at(small, large), 4),
        "oracle_small_share_at_95": round(oracle_small_share_at(small, large), 4),
        "forced_small": int(np.sum(forced == FORCED_SMALL)),
        "forced_large": int(np.sum(forced == FORCED_LARGE)),
        "decision_p50_us": _percentile_us(decision_us, 0.5),
        "decision_p99_us": _percentile_us(decision_us, 0.99),
    }


def figures(
    prompts: Sequence[LabeledPrompt],
    decide_for: Sequence[Decide],
    fixed_tier: FixedTier | None = None,
) -> dict[str, Any]:
    """Route every prompt through the decision (`decide_for[i]` scores prompt i), timing
    each, and report per source and overall."""
    n = len(prompts)
    scores, forced, decision_us = np.zeros(n), np.zeros(n), np.zeros(n)
    for i, (prompt, decide) in enumerate(zip(prompts, decide_for, strict=True)):
        started = time.perf_counter_ns()
        tier = fixed_tier(prompt.prompt) if fixed_tier is not None else None
        if tier == "small":
            forced[i] = FORCED_SMALL
        elif tier == "large":
            forced[i] = FORCED_LARGE
        else:
            scores[i] = decide(prompt.prompt)
        decision_us[i] = (time.perf_counter_ns() - started) / 1000
    small = np.array([p.small_ok for p in prompts])
    large = np.array([p.large_ok for p in prompts])
    sources = np.array([p.source for p in prompts])
    report: dict[str, Any] = {
        source: source_figures(
            scores[sources == source],
            small[sources == source],
            large[sources == source],
            forced[sources == source],
            decision_us[sources == source],
        )
        for source in sorted(set(sources))
    }
    report["decision_p99_us"] = _percentile_us(decision_us, 0.99)
    return report


def _percentile_us(values: Vector, q: float) -> float:
    return round(percentile(sorted(values.tolist()), q), 1)


def route_eval(
    prompts: Sequence[LabeledPrompt],
    *,
    router: LearnedRouter | None = None,
    config: TrainConfig | None = None,
    folds: int = 0,
    fixed_tier: FixedTier | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The figures, held out by group (default), or for `router` as it is."""
    if router is not None:
        head: dict[str, Any] = {
            "mode": "artifact: scored as it is, no training (held out only if it never saw "
            "these labels)",
            "router": {"version": router.version, "trained_on": router.trained_on},
        }
        return {
            **head,
            "prompts": len(prompts),
            **figures(prompts, [router.score] * len(prompts), fixed_tier),
        }
    config = config or TrainConfig()
    design = Design.of([p.prompt for p in prompts], config.hash_bits)
    _, models, model_of = held_out_logits(prompts, design, config, folds, progress)
    routers = [router_of(m, config, trained_on="fold") for m in models]
    head = {
        "mode": (
            f"grouped held-out: {len(models)} folds over {len({p.group for p in prompts})} "
            "groups, each prompt scored by a model trained without its group"
        ),
    }
    decide_for = [routers[k].score for k in model_of]
    return {**head, "prompts": len(prompts), **figures(prompts, decide_for, fixed_tier)}


def route_eval_parts(
    prompts: Sequence[LabeledPrompt],
    *,
    part: str = "both",
    router: LearnedRouter | None = None,
    config: TrainConfig | None = None,
    folds: int = 0,
    fixed_tier: FixedTier | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """`route_eval` under the protocol: each part apart (`both`), one part, or `all`
    pooled. An artifact is scored as it is on each part; otherwise the design part is held
    out by group within itself and the report part is scored by a model trained on the
    whole design part (no report-part prompt trains anything)."""

    def held_out(chosen: Sequence[LabeledPrompt]) -> dict[str, Any]:
        return route_eval(
            chosen, router=router, config=config, folds=folds, fixed_tier=fixed_tier,
            progress=progress,
        )  # fmt: skip

    if part == "all":
        return {"part": "all", **held_out(prompts)}
    parts = split(prompts, lambda p: p.group)
    results: dict[str, dict[str, Any]] = {}
    for name in PARTS:
        if part not in ("both", name):
            continue
        chosen = parts[name]
        if router is not None or name == "design":
            results[name] = held_out(chosen)
            continue
        results[name] = _trained_on_design(parts["design"], chosen, config, fixed_tier, progress)
    if part != "both":
        return {"part": part, **results[part]}
    return {"part": "both", "parts": results}


def _trained_on_design(
    trained: Sequence[LabeledPrompt],
    chosen: Sequence[LabeledPrompt],
    config: TrainConfig | None,
    fixed_tier: FixedTier | None,
    progress: Progress | None,
) -> dict[str, Any]:
    config = config or TrainConfig()
    model = fit(Design.of([p.prompt for p in trained], config.hash_bits), trained, config)
    if progress:
        progress(f"report part: scored by one model trained on the {len(trained)} "
                 "design-part prompts")  # fmt: skip
    scorer = router_of(model, config, trained_on="the design part").score
    return {
        "mode": f"trained on the design part ({len(trained)} prompts, "
        f"{len({p.group for p in trained})} groups), scored on this part's "
        f"{len({p.group for p in chosen})} groups",
        "prompts": len(chosen),
        **figures(chosen, [scorer] * len(chosen), fixed_tier),
    }


def parts_table(report: dict[str, Any]) -> str:
    if report["part"] != "both":
        return f"part: {report['part']}\n" + table(report)
    return "\n\n".join(f"{name} part\n" + table(report["parts"][name]) for name in PARTS)


TABLE_ROWS = (
    "n",
    "small_share_at_95",
    "random_small_share_at_95",
    "oracle_small_share_at_95",
    "apgr",
    "always_small_quality",
    "always_large_quality",
    "forced_small",
    "forced_large",
    "decision_p50_us",
    "decision_p99_us",
)


def table(report: dict[str, Any]) -> str:
    """The report as a figure-by-source table, headed by how the figures were made."""
    sources = [k for k, v in report.items() if isinstance(v, dict) and "apgr" in v]
    lines = [
        f"{report['prompts']} prompts; {report['mode']}",
        f"{'figure':<26}" + "".join(f"{s:>10}" for s in sources),
    ]
    for row in TABLE_ROWS:
        lines.append(f"{row:<26}" + "".join(f"{_cell(report[s][row]):>10}" for s in sources))
    lines.append(f"decision p99 over all prompts: {report['decision_p99_us']} us")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if value < 10 else f"{value:.1f}"
    return "-" if value is None else str(value)
