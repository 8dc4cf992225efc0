#!/usr/bin/env bash
# Create (or reuse) a virtual environment cached outside the checkout, keyed by its
# requirements file (and the Python and machine), and link it into the checkout. A clean
# clone (CI) reuses the cache; a changed requirements file builds a new one. For tools that
# must never share the gateway's environment (their own pins, or torch) and need no
# network once built.
#
#   deploy/cached-venv.sh NAME REQUIREMENTS LINK CHECK [SIZE]
#
# CHECK is Python the new environment must run without error (its imports), else the
# build fails and is not marked complete; SIZE is said while building ("a few minutes").
set -euo pipefail
cd "$(dirname "$0")/.."

name=$1 req=$2 link=$3 check=$4 size=${5:-a few minutes}
python="${PYTHON:-python3.11}"
cache="${AGW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agent-gateway}"
key=$( (cat "$req"; "$python" -c 'import sys; print(sys.version)'; uname -m) | sha256sum | cut -c1-16)
venv="$cache/$name-venv-$key"

if [ ! -f "$venv/.complete" ]; then
  echo "$name-env: building $venv from $req ($size; once per requirements)"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --progress-bar off -r "$req" 2>&1 \
    | grep -E --line-buffered '^(Collecting|Successfully|ERROR)' \
    | sed -u -E "s/ \(from .*//; s/^(Successfully installed).*/\1/; s/^/$name-env: /" || true
  "$venv/bin/python" -c "$check" \
    || { echo "$name-env: $venv does not pass its check: $check" >&2; exit 1; }
  touch "$venv/.complete"
fi
ln -sfn "$venv" "$link"
echo "$name-env: $link -> $venv"
