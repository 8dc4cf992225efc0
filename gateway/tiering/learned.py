"""The learned tier router: a prompt's score, from an artifact `gateway route-train` wrote.

`score(text)` is probability-like, higher when the small tier is good enough. The shipped
artifact (`artifacts/router-v2.npz`, trained on RouteLLM's MMLU and GSM8K labels, numeric
features only: hashed words did not carry to MMLU subjects no choice looked at) is
shifted so that 0.5 is where routing kept 95% of the large tier's quality on prompts from
groups its training folds had not seen; see `gateway.offline.route_train.train`. Whatever heads the
trainer fitted, the artifact holds their sum: one linear logit over the prompt's features.

An artifact is one `.npz` (loaded with `allow_pickle=False`): the weight arrays, and a
JSON string `meta` with the version, what it was trained on and the features version. One
written for other features is refused, since its weights would mean other things.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.lifetime.startup import StartupRefused
from gateway.tiering.features import FEATURES_VERSION, NUMERIC_NAMES, extract

SHIPPED = "artifacts/router-v2.npz"


class ArtifactError(StartupRefused):
    """A router artifact that cannot be used (unreadable, or for other features): the
    operator names another or retrains; at start-up said in one line."""


@dataclass(frozen=True, eq=False)
class LearnedRouter:
    version: str
    trained_on: str
    hash_bits: int
    hashed_weights: npt.NDArray[np.float32]
    numeric_mean: npt.NDArray[np.float64]
    numeric_scale: npt.NDArray[np.float64]
    numeric_weights: npt.NDArray[np.float64]
    bias: float
    numeric_clip: float
    suggested_threshold: float = 0.5  # keeps ~95% of large quality, see the module docstring
    notes: dict[str, Any] = field(default_factory=dict)  # figures recorded at training
    # Whether any word has a weight; without, a decision skips hashing the prompt.
    reads_words: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads_words", bool(np.any(self.hashed_weights)))

    @classmethod
    def load(cls, path: str | Path | None = None) -> LearnedRouter:
        """From an artifact file; None loads the one shipped with the gateway."""
        if path is None:
            with resources.as_file(resources.files("gateway.tiering") / SHIPPED) as shipped:
                return cls._read(shipped)
        return cls._read(Path(path))

    @classmethod
    def _read(cls, path: Path) -> LearnedRouter:
        try:
            with np.load(path, allow_pickle=False) as arrays:
                meta = json.loads(str(arrays["meta"]))
                weights = {k: np.asarray(arrays[k]) for k in arrays.files if k != "meta"}
        except (OSError, ValueError, KeyError) as exc:
            raise ArtifactError(f"{path}: not a router artifact ({exc})") from exc
        if meta.get("features_version") != FEATURES_VERSION:
            raise ArtifactError(
                f"{path}: written for features version {meta.get('features_version')}, "
                f"this gateway computes version {FEATURES_VERSION}; retrain it"
            )
        if tuple(meta.get("numeric_names", ())) != NUMERIC_NAMES:
            raise ArtifactError(f"{path}: its numeric features differ from this gateway's")
        return cls(
            version=meta["version"],
            trained_on=meta["trained_on"],
            hash_bits=int(meta["hash_bits"]),
            hashed_weights=weights["hashed_weights"].astype(np.float32),
            numeric_mean=weights["numeric_mean"].astype(np.float64),
            numeric_scale=weights["numeric_scale"].astype(np.float64),
            numeric_weights=weights["numeric_weights"].astype(np.float64),
            bias=float(meta["bias"]),
            numeric_clip=float(meta["numeric_clip"]),
            suggested_threshold=float(meta.get("suggested_threshold", 0.5)),
            notes=dict(meta.get("notes", {})),
        )

    def save(self, path: str | Path) -> None:
        meta = {
            "version": self.version,
            "trained_on": self.trained_on,
            "features_version": FEATURES_VERSION,
            "numeric_names": list(NUMERIC_NAMES),
            "hash_bits": self.hash_bits,
            "bias": self.bias,
            "numeric_clip": self.numeric_clip,
            "suggested_threshold": self.suggested_threshold,
            "notes": self.notes,
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as out:  # a file object: savez would append `.npz` to a name
            np.savez_compressed(
                out,
                meta=np.array(json.dumps(meta)),
                hashed_weights=self.hashed_weights,
                numeric_mean=self.numeric_mean,
                numeric_scale=self.numeric_scale,
                numeric_weights=self.numeric_weights,
            )

    def logit(self, text: str) -> float:
        features = extract(text, self.hash_bits, words=self.reads_words)
        hashed = float(self.hashed_weights[features.slots] @ features.values)
        numeric = np.clip(
            (np.array(features.numeric) - self.numeric_mean) / self.numeric_scale,
            -self.numeric_clip,
            self.numeric_clip,
        )
        return hashed + float(numeric @ self.numeric_weights) + self.bias

    def score(self, text: str) -> float:
        return 0.5 * (1.0 + math.tanh(0.5 * self.logit(text)))
