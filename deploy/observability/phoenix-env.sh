#!/usr/bin/env bash
# Create (or reuse) Arize Phoenix's virtual environment, cached outside the checkout and
# keyed by its requirements file, then link it as .venv-phoenix. A clean clone (CI) reuses
# the cache; a changed requirements file builds a new one. Phoenix pins its own fastapi,
# sqlalchemy and grpc stack, which is why it never shares the gateway's environment; it is
# dev-only (traces UI, trace round-trip tests) and needs no network once built.
set -euo pipefail
cd "$(dirname "$0")/../.."

req=deploy/observability/phoenix-requirements.txt
python="${PYTHON:-python3.11}"
cache="${AGW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agent-gateway}"
key=$( (cat "$req"; "$python" -c 'import sys; print(sys.version)'; uname -m) | sha256sum | cut -c1-16)
venv="$cache/phoenix-venv-$key"

if [ ! -f "$venv/.complete" ]; then
  echo "phoenix-env: building $venv from $req (Phoenix: a few minutes, 850 MB; once per requirements)"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --progress-bar off -r "$req" 2>&1 \
    | grep -E --line-buffered '^(Collecting|Successfully|ERROR)' \
    | sed -u -E 's/ \(from .*//; s/^(Successfully installed).*/\1/; s/^/phoenix-env: /' || true
  "$venv/bin/python" -c 'import phoenix.server.main' 2>/dev/null \
    || { echo "phoenix-env: arize-phoenix failed to install" >&2; exit 1; }
  test -x "$venv/bin/phoenix" || { echo "phoenix-env: no phoenix command in $venv" >&2; exit 1; }
  touch "$venv/.complete"
fi
ln -sfn "$venv" .venv-phoenix
echo "phoenix-env: .venv-phoenix -> $venv"
