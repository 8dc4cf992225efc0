#!/usr/bin/env bash
# Build (or reuse) the peer gateways that `make bench` measures beside ours, each in its own
# environment cached outside the checkout (like engine/setup-env.sh) and linked into it:
#   .venv-litellm       the LiteLLM proxy (litellm-requirements.txt, hash-checked)
#   .venv-vllm-router   vllm-router (a Rust router on PyPI)
#   .node-portkey       @portkey-ai/gateway (npm; run with node)
# Every peer is optional: one that fails to build is reported here and in
# .run/bench/peers.txt, which the benchmark reads to say why it is missing; the script
# itself never fails for it. Nothing is downloaded once these are built: the benchmark
# runs offline.
set -uo pipefail
cd "$(dirname "$0")/../../.."

here=tests/bench/overhead
python="${PYTHON:-python3.11}"
cache="${AGW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agent-gateway}"
VLLM_ROUTER_VERSION=0.1.17
PORTKEY_VERSION=1.15.2
status=.run/bench/peers.txt
mkdir -p "$cache" .run/bench
: >"$status"

key() { ( "$@"; "$python" -c 'import sys; print(sys.version)'; uname -m ) | sha256sum | cut -c1-16; }
# pip's progress reduced to what was collected and the errors; the full log stays in $1.log.
quiet_pip() { grep -E --line-buffered '^(ERROR|Successfully installed)' | sed -u -E "s/^(Successfully installed).*/\1/; s/^/peers-env: $1: /" || true; }

report() {  # name, link, outcome ("ok" or the reason it failed)
  if [ "$3" = ok ]; then
    printf '%s\tok\t%s\n' "$1" "$(readlink "$2")" >>"$status"
    echo "peers-env: $2 -> $(readlink "$2")"
  else
    printf '%s\tfailed\t%s\n' "$1" "$3" >>"$status"
    echo "peers-env: $1 left out: $3" >&2
  fi
}

build_python_peer() {  # name, venv dir, check command, pip arguments...
  local name=$1 venv=$2 check=$3
  shift 3
  [ -f "$venv/.complete" ] && return 0
  echo "peers-env: building $name in $venv (once per pinned version)"
  rm -rf "$venv"
  "$python" -m venv "$venv" || return 1
  "$venv/bin/pip" install --quiet --upgrade pip >/dev/null 2>&1
  "$venv/bin/pip" install --progress-bar off "$@" >"$venv.log" 2>&1
  quiet_pip "$name" <"$venv.log"
  "$venv/bin/$check" --help >/dev/null 2>&1 || return 1
  touch "$venv/.complete"
}

failure() {  # the last pip error of a build log, else a generic reason
  local line
  line=$(grep -E '^ERROR' "$1" 2>/dev/null | tail -1)
  echo "${line:-$2}"
}

# LiteLLM: every package pinned with its sha256 (see the requirements file for why).
req=$here/litellm-requirements.txt
venv="$cache/litellm-venv-$(key cat "$req")"
if build_python_peer litellm "$venv" litellm --require-hashes -r "$req"; then
  ln -sfn "$venv" .venv-litellm
  report litellm .venv-litellm ok
else
  report litellm .venv-litellm "$(failure "$venv.log" "litellm did not install")"
fi

venv="$cache/vllm-router-venv-$(key echo "vllm-router==$VLLM_ROUTER_VERSION")"
if build_python_peer vllm-router "$venv" vllm-router "vllm-router==$VLLM_ROUTER_VERSION"; then
  ln -sfn "$venv" .venv-vllm-router
  report vllm-router .venv-vllm-router ok
else
  report vllm-router .venv-vllm-router "$(failure "$venv.log" "vllm-router did not install")"
fi

# Portkey's gateway from npm, without install scripts (its only one is patch-package, for
# patches the published package does not ship). @hono/node-server is held at 1.13.5, the
# version Portkey's own repository pins and patches: with the 1.19.x that npm picks today
# for its "^1.3.3", the lightweight Response keeps the upstream fetch's immutable headers,
# Portkey's header append throws, and every streamed request answers 500.
manifest='{"private": true, "dependencies": {"@portkey-ai/gateway": "'$PORTKEY_VERSION'"},
 "overrides": {"@hono/node-server": "1.13.5"}}'
dir="$cache/portkey-$(key echo "$manifest $(node --version 2>/dev/null)")"
entry=node_modules/@portkey-ai/gateway/build/start-server.js
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  report portkey .node-portkey "node and npm are not installed"
elif [ -f "$dir/.complete" ] || {
  echo "peers-env: installing @portkey-ai/gateway@$PORTKEY_VERSION in $dir"
  rm -rf "$dir" && mkdir -p "$dir" && echo "$manifest" >"$dir/package.json" \
    && npm install --prefix "$dir" --no-audit --no-fund --ignore-scripts --loglevel=error \
      >"$dir.log" 2>&1 \
    && [ -f "$dir/$entry" ] && touch "$dir/.complete"
}; then
  ln -sfn "$dir" .node-portkey
  report portkey .node-portkey ok
else
  report portkey .node-portkey "npm install failed: $(grep -m1 -i 'err' "$dir.log" 2>/dev/null)"
fi
exit 0
