"""Training the learned tier router from labelled prompts (`gateway route-train`), in numpy.

Labels are RouteLLM-style JSONL (gateway/offline/route_train/labels.py reads them); the losses are
minimised with L-BFGS (gateway/offline/route_train/lbfgs.py).

The model is one linear logit over the numeric features of `gateway.tiering.features`
(and, with `words`, its hashed words), the sum of two L2-penalised logistic regressions
("heads"):

- the advantage head predicts the small tier's advantage, `(small - large + 1) / 2`:
  ranking prompts by its expectation is what keeps the most quality per prompt sent to the
  small tier, and a prompt both tiers fail counts as free to send small, as it is. But
  whether the large tier fails is a property of a domain (its grading, the large model's
  competence there) that does not carry to another one;
- the difficulty head reads only `DIFFICULTY_NAMES` (how much work a question asks for:
  words, sentences, quantities, step words) and predicts whether the small tier answers
  right. It knows no subject, so what it learns is what makes any question harder.

The router's logit is the advantage logit plus `difficulty_weight` times the difficulty
logit. Both heads standardise the numeric features alike, so the sum is one model and the
artifact stores it as one.

**How the defaults were chosen** (docs/development/evaluation.md): on the design part of
the evaluation protocol only (gateway/offline/protocol.py; 11 MMLU subjects and GSM8K,
held out by group within it), eleven candidates (head weights 0.25-4, word penalties,
no words, numeric penalties); the best MMLU figure was shared by "no words, weight 1.0"
and "words at a 10x penalty, weight 1.0" (0.554 against 0.537 for the design of
2026-12-01), and the simpler one was taken. Scored once on the report part (15 MMLU
subjects no choice looked at, model trained on the design part): 0.539 against 0.499 for
the earlier design. Hashed words describe a subject, and a subject's words do not carry to
another subject; `words=True` (`gateway route-train --words`) is for labels from the
traffic the router will see, where they do.

Each group (MMLU subject, or the source when there is none) gets its own intercept while
training, dropped afterwards. Groups differ in ways no prompt text explains (one subject's
grading may fail the large tier throughout), and without those intercepts the weights learn
"sounds like that subject" instead of what makes a prompt hard within any subject, which
is what carries to prompts from elsewhere.

The logit is shifted so that a score of 0.5 is the point where, on out-of-group scores of
the training data, routing keeps 95% of the large tier's quality: the policy's default
threshold then means something.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.offline.route_train.labels import LabeledPrompt
from gateway.offline.route_train.lbfgs import minimise
from gateway.tiering.features import DIFFICULTY_NAMES, FEATURES_VERSION, NUMERIC_NAMES, extract
from gateway.tiering.learned import LearnedRouter

Vector = npt.NDArray[np.float64]
Indices = npt.NDArray[np.int64]
Progress = Callable[[str], None]

QUALITY_KEPT = 0.95
NUMERIC_CLIP = 5.0  # standard deviations: an unusual prompt cannot swing the score alone


@dataclass(frozen=True)
class TrainConfig:
    hash_bits: int = 18
    l2_hashed: float = 1e-3
    l2_numeric: float = 1e-3
    l2_group: float = 1e-4  # the per-group intercepts: nearly free to fit the group's mean
    iterations: int = 300
    difficulty_weight: float = 1.0  # the difficulty head's share of the logit, see above
    words: bool = False  # hashed words in the advantage head: for in-domain labels, see above
    calibration_folds: int = 5
    seed: int = 0


@dataclass(frozen=True)
class Design:
    """The training matrix: hashed features as (row, slot, value) entries, numeric features
    dense and as extracted (each fit standardises them on its own rows)."""

    row_of: Indices  # row of each stored entry
    slots: Indices
    values: Vector
    numeric: Vector  # (rows, len(NUMERIC_NAMES))
    hashed_dim: int

    @classmethod
    def of(cls, prompts: Sequence[str], bits: int) -> Design:
        features = [extract(p, bits) for p in prompts]
        return cls(
            row_of=np.repeat(np.arange(len(features)), [len(f.slots) for f in features]),
            slots=np.concatenate([f.slots for f in features]),
            values=np.concatenate([f.values for f in features]),
            numeric=np.array([f.numeric for f in features], dtype=np.float64).reshape(
                len(features), len(NUMERIC_NAMES)
            ),
            hashed_dim=1 << bits,
        )

    @property
    def rows(self) -> int:
        return int(self.numeric.shape[0])

    def without_words(self) -> Design:
        empty = np.zeros(0, dtype=np.int64)
        return Design(empty, empty, np.zeros(0), self.numeric, self.hashed_dim)

    def take(self, rows: Indices) -> Design:
        keep = np.isin(self.row_of, rows)
        renumber = np.full(self.rows, -1, dtype=np.int64)
        renumber[rows] = np.arange(len(rows))
        return Design(
            renumber[self.row_of[keep]],
            self.slots[keep],
            self.values[keep],
            self.numeric[rows],
            self.hashed_dim,
        )

    def hashed_dot(self, weights: Vector) -> Vector:
        products = self.values * weights[self.slots]
        return np.asarray(np.bincount(self.row_of, products, self.rows), dtype=np.float64)

    def hashed_gradient(self, residual: Vector) -> Vector:
        products = self.values * residual[self.row_of]
        return np.asarray(np.bincount(self.slots, products, self.hashed_dim), dtype=np.float64)


@dataclass(frozen=True)
class Fitted:
    hashed: Vector
    numeric_mean: Vector
    numeric_scale: Vector
    numeric: Vector
    bias: float

    def logits(self, design: Design) -> Vector:
        z = _standardised(design.numeric, self.numeric_mean, self.numeric_scale)
        return design.hashed_dot(self.hashed) + z @ self.numeric + self.bias

    def plus(self, other: Fitted, weight: float) -> Fitted:
        """This model's logit plus `weight` times `other`'s, as one model: exact because
        both standardised the same rows' features (and clip them alike)."""
        if not (
            np.array_equal(self.numeric_mean, other.numeric_mean)
            and np.array_equal(self.numeric_scale, other.numeric_scale)
        ):
            raise ValueError("models standardised on different rows cannot be added")
        return Fitted(
            self.hashed + weight * other.hashed,
            self.numeric_mean,
            self.numeric_scale,
            self.numeric + weight * other.numeric,
            self.bias + weight * other.bias,
        )


@dataclass(frozen=True)
class Head:
    """One logistic regression inside the router: what it predicts, what it may read."""

    target: Callable[[LabeledPrompt], float]
    reads_words: bool
    numeric: tuple[str, ...]  # the numeric features it may weigh; the others stay at 0


ADVANTAGE = Head(lambda p: p.small_advantage, reads_words=True, numeric=NUMERIC_NAMES)
ADVANTAGE_NO_WORDS = replace(ADVANTAGE, reads_words=False)
DIFFICULTY = Head(lambda p: p.small_ok, reads_words=False, numeric=DIFFICULTY_NAMES)


def fit(design: Design, prompts: Sequence[LabeledPrompt], config: TrainConfig) -> Fitted:
    """The router's model on these rows: the advantage head plus `difficulty_weight` times
    the difficulty head."""
    head = ADVANTAGE if config.words else ADVANTAGE_NO_WORDS
    advantage = fit_head(design, prompts, head, config)
    if config.difficulty_weight == 0:
        return advantage
    difficulty = fit_head(design, prompts, DIFFICULTY, config)
    return advantage.plus(difficulty, config.difficulty_weight)


def fit_head(
    design: Design, prompts: Sequence[LabeledPrompt], head: Head, config: TrainConfig
) -> Fitted:
    """L2-penalised logistic regression with per-group intercepts, by L-BFGS."""
    targets = np.array([head.target(p) for p in prompts], dtype=np.float64)
    groups = [p.group for p in prompts]
    mean = design.numeric.mean(axis=0)
    scale = design.numeric.std(axis=0)
    scale[scale < 1e-9] = 1.0  # constant in training: weight stays 0, value ignored
    # Columns the head may not read are zero: their gradient is 0, so their weights stay 0.
    reads = np.array([name in head.numeric for name in NUMERIC_NAMES], dtype=np.float64)
    numeric = _standardised(design.numeric, mean, scale) * reads
    if not head.reads_words:
        design = design.without_words()
    names = {name: i for i, name in enumerate(sorted(set(groups)))}
    group = np.array([names[g] for g in groups], dtype=np.int64)
    # Only slots some prompt uses can get a weight (the rest stay 0 under L2): optimise
    # over those, numbered densely, and put them back in place at the end.
    used, dense_slots = np.unique(design.slots, return_inverse=True)
    compact = Design(design.row_of, dense_slots, design.values, design.numeric, len(used))
    n_hashed, n_numeric, n_groups = len(used), numeric.shape[1], len(names)
    weight = 1.0 / design.rows

    def objective(p: Vector) -> tuple[float, Vector]:
        w_hashed = p[:n_hashed]
        w_numeric = p[n_hashed : n_hashed + n_numeric]
        w_group = p[n_hashed + n_numeric : -1]
        logits = compact.hashed_dot(w_hashed) + numeric @ w_numeric + w_group[group] + p[-1]
        loss = weight * float(np.sum(np.logaddexp(0.0, logits) - targets * logits))
        residual = weight * (_sigmoid(logits) - targets)
        penalty = 0.5 * (
            config.l2_hashed * float(w_hashed @ w_hashed)
            + config.l2_numeric * float(w_numeric @ w_numeric)
            + config.l2_group * float(w_group @ w_group)
        )
        gradient = np.concatenate(
            [
                compact.hashed_gradient(residual) + config.l2_hashed * w_hashed,
                numeric.T @ residual + config.l2_numeric * w_numeric,
                np.bincount(group, weights=residual, minlength=n_groups)
                + config.l2_group * w_group,
                [residual.sum()],
            ]
        )
        return loss + penalty, gradient

    p = minimise(objective, np.zeros(n_hashed + n_numeric + n_groups + 1), config.iterations)
    hashed = np.zeros(design.hashed_dim)
    hashed[used] = p[:n_hashed]
    # The group intercepts are dropped; their mean joins the bias, so a prompt from a group
    # never seen scores like one from an average group.
    bias = float(p[-1] + p[n_hashed + n_numeric : -1].mean())
    return Fitted(hashed, mean, scale, p[n_hashed : n_hashed + n_numeric], bias)


def grouped_folds(
    groups: Sequence[str], folds: int = 0, seed: int = 0
) -> list[tuple[Indices, Indices]]:
    """(train rows, held-out rows) per fold; a group is never on both sides. `folds` 0 (or
    at least the number of groups) holds each group out once; else groups are dealt to
    the fold with the fewest rows so far, largest first (seed 0) or in a seeded order."""
    sizes_of = {name: sum(g == name for g in groups) for name in sorted(set(groups))}
    names = sorted(sizes_of, key=lambda name: -sizes_of[name])
    if seed:
        names = [names[i] for i in np.random.default_rng(seed).permutation(len(names))]
    count = len(names) if folds <= 0 or folds >= len(names) else folds
    rows_in = [0] * count
    fold_of: dict[str, int] = {}
    for name in names:
        fold_of[name] = rows_in.index(min(rows_in))
        rows_in[fold_of[name]] += sizes_of[name]
    assigned = np.array([fold_of[g] for g in groups])
    rows = np.arange(len(groups))
    return [(rows[assigned != k], rows[assigned == k]) for k in range(count)]


def held_out_logits(
    prompts: Sequence[LabeledPrompt],
    design: Design,
    config: TrainConfig,
    folds: int = 0,
    progress: Progress | None = None,
) -> tuple[Vector, list[Fitted], Indices]:
    """Each prompt's logit from a model trained without its group; also the fold models
    and which of them scored each prompt."""
    groups = [p.group for p in prompts]
    logits = np.zeros(len(prompts))
    models: list[Fitted] = []
    model_of = np.zeros(len(prompts), dtype=np.int64)
    splits = grouped_folds(groups, folds, config.seed)
    for k, (train, test) in enumerate(splits):
        started = time.monotonic()
        model = fit(design.take(train), [prompts[i] for i in train], config)
        logits[test] = model.logits(design.take(test))
        models.append(model)
        model_of[test] = k
        if progress:
            held = sorted({groups[i] for i in test})
            progress(
                f"fold {k + 1}/{len(splits)}: held out {', '.join(held)[:70]} "
                f"({len(test)} prompts, {time.monotonic() - started:.1f}s)"
            )
    return logits, models, model_of


def train_router(
    prompts: Sequence[LabeledPrompt],
    config: TrainConfig = TrainConfig(),
    *,
    labels_name: str = "",
    progress: Progress | None = None,
) -> LearnedRouter:
    design = Design.of([p.prompt for p in prompts], config.hash_bits)
    say = progress or (lambda _: None)
    say(f"features: {design.rows} prompts, {len(design.slots)} hashed entries")
    offset = 0.0
    words = "with words" if config.words else "no words"
    notes: dict[str, Any] = {
        "heads": f"advantage ({words}) + {config.difficulty_weight} x difficulty",
        "difficulty_features": list(DIFFICULTY_NAMES),
    }
    if config.calibration_folds > 1 and len({p.group for p in prompts}) > 1:
        logits, _, _ = held_out_logits(prompts, design, config, config.calibration_folds, say)
        offset, share = quality_threshold(logits, prompts)
        notes["calibration"] = {"folds": config.calibration_folds, "small_share": share}
        say(
            f"calibration: score 0.5 at logit {offset:.3f}, where out-of-group scores kept "
            f"{QUALITY_KEPT:.0%} of large quality sending {share:.1%} of prompts small"
        )
    started = time.monotonic()
    model = fit(design, prompts, config)
    say(f"final fit on all {design.rows} prompts: {time.monotonic() - started:.1f}s")
    described = _describe(prompts)
    trained_on = f"{labels_name}: {described}" if labels_name else described
    return replace(router_of(model, config, trained_on, offset), notes=notes)


def router_of(
    model: Fitted, config: TrainConfig, trained_on: str, offset: float = 0.0
) -> LearnedRouter:
    return LearnedRouter(
        version=f"router-f{FEATURES_VERSION}",
        trained_on=trained_on,
        hash_bits=config.hash_bits,
        hashed_weights=model.hashed.astype(np.float32),
        numeric_mean=model.numeric_mean,
        numeric_scale=model.numeric_scale,
        numeric_weights=model.numeric,
        bias=model.bias - offset,
        numeric_clip=NUMERIC_CLIP,
    )


def quality_threshold(logits: Vector, prompts: Sequence[LabeledPrompt]) -> tuple[float, float]:
    """The logit threshold sending the most prompts (all sources pooled) to the small tier
    while keeping `QUALITY_KEPT` of always-large quality; and that share."""
    small = np.array([p.small_ok for p in prompts])
    large = np.array([p.large_ok for p in prompts])
    order = np.argsort(-logits, kind="stable")
    kept = large.sum() + np.cumsum((small - large)[order])
    meets = np.nonzero(kept >= QUALITY_KEPT * large.sum() - 1e-9)[0]
    if len(meets) == 0:
        return float(logits.max()) + 1.0, 0.0
    last = int(meets.max())
    return float(logits[order][last]), round((last + 1) / len(prompts), 4)


def _describe(prompts: Iterable[LabeledPrompt]) -> str:
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.source] = counts.get(p.source, 0) + 1
    return ", ".join(f"{n} {source}" for source, n in sorted(counts.items()))


def _standardised(numeric: Vector, mean: Vector, scale: Vector) -> Vector:
    return np.clip((numeric - mean) / scale, -NUMERIC_CLIP, NUMERIC_CLIP)


def _sigmoid(x: Vector) -> Vector:
    return 0.5 * (1.0 + np.tanh(0.5 * x))
