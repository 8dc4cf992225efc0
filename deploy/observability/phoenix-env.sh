#!/usr/bin/env bash
# Create (or reuse) Arize Phoenix's virtual environment, cached outside the checkout and
# keyed by its requirements file, then link it as .venv-phoenix (deploy/cached-venv.sh).
# Phoenix pins its own fastapi, sqlalchemy and grpc stack, which is why it never shares the
# gateway's environment; it is dev-only (traces UI, trace round-trip tests) and needs no
# network once built.
set -euo pipefail
cd "$(dirname "$0")/../.."

exec bash deploy/cached-venv.sh phoenix deploy/observability/phoenix-requirements.txt \
  .venv-phoenix \
  'import os, sys, phoenix.server.main; assert os.access(os.path.join(sys.prefix, "bin", "phoenix"), os.X_OK), "no phoenix command"' \
  "Phoenix: a few minutes, 850 MB"
