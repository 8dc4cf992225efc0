#!/usr/bin/env bash
# Install (or reuse) the coding agents the tests drive through the gateway, Claude Code and
# Codex CLI (npm), cached outside the checkout and keyed by tests/clients/package.json, then
# link them as .clients (their binaries in .clients/node_modules/.bin). Test-only; no
# network once built.
set -euo pipefail
cd "$(dirname "$0")/../.."

spec=tests/clients/package.json
cache="${AGW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agent-gateway}"
key=$( (cat "$spec"; node --version; uname -m) | sha256sum | cut -c1-16)
dir="$cache/clients-$key"

if [ ! -f "$dir/.complete" ]; then
  echo "clients-env: installing Claude Code and Codex CLI into $dir (about a minute, 300 MB; once per package.json)"
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$spec" "$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error 2>&1 | sed -u 's/^/clients-env: /')
  for bin in claude codex; do
    "$dir/node_modules/.bin/$bin" --version >/dev/null \
      || { echo "clients-env: $bin does not run" >&2; exit 1; }
  done
  touch "$dir/.complete"
fi
ln -sfn "$dir" .clients
echo "clients-env: .clients -> $dir"
