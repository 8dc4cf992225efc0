#!/usr/bin/env bash
# `make traces`: Arize Phoenix (a local OTLP trace receiver with a web UI), then the same
# stack as `make run` exporting every request's spans to it, until Ctrl-C. Dev only: it
# samples every request (OTEL_TRACES_SAMPLER_ARG=1), which costs CPU under load.
# Phoenix keeps its traces in .run/phoenix across runs; `make clean` removes them.
set -euo pipefail
cd "$(dirname "$0")/../.."

bash deploy/observability/phoenix-env.sh

host=127.0.0.1
port="${PHOENIX_PORT:-6006}"
grpc_port="${PHOENIX_GRPC_PORT:-4317}"
work=.run/phoenix
base="http://$host:$port"
mkdir -p "$work"

# Phoenix on a busy port exits at once; say so instead of sending traces to a stranger.
if curl -s -o /dev/null --max-time 1 "$base/"; then
  echo "traces: something already answers on $base; stop it or set PHOENIX_PORT" >&2
  exit 1
fi

phoenix_pid=""
# shellcheck disable=SC2317  # reached through the EXIT trap
stop_phoenix() {
  [ -n "$phoenix_pid" ] || return 0
  kill -TERM "$phoenix_pid" 2>/dev/null || return 0
  # Phoenix flushes its span queue on SIGTERM (a second or two); don't wait forever.
  for _ in $(seq 1 50); do
    kill -0 "$phoenix_pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$phoenix_pid" 2>/dev/null || true
}
trap stop_phoenix EXIT

echo "traces: starting Phoenix (about 10 s; log in $work/phoenix.log)"
# No telemetry pixels, web fonts or assistant tools: the machine may be offline, and the
# assistant's server-side bash has no business on a developer's laptop.
PHOENIX_HOST="$host" PHOENIX_PORT="$port" PHOENIX_GRPC_PORT="$grpc_port" \
  PHOENIX_WORKING_DIR="$PWD/$work" \
  PHOENIX_TELEMETRY_ENABLED=false PHOENIX_ALLOW_EXTERNAL_RESOURCES=false \
  PHOENIX_DISABLE_AGENT_ASSISTANT=true PHOENIX_AGENTS_DISABLE_BASH=true \
  PHOENIX_LOG_MIGRATIONS=false \
  .venv-phoenix/bin/phoenix serve >"$work/phoenix.log" 2>&1 &
phoenix_pid=$!

for _ in $(seq 1 240); do
  if curl -sf -o /dev/null --max-time 1 "$base/healthz"; then
    break
  fi
  if ! kill -0 "$phoenix_pid" 2>/dev/null; then
    echo "traces: Phoenix exited while starting:" >&2
    tail -n 20 "$work/phoenix.log" >&2
    exit 1
  fi
  sleep 0.25
done
if ! curl -sf -o /dev/null --max-time 1 "$base/healthz"; then
  echo "traces: Phoenix did not answer on $base within 60 s:" >&2
  tail -n 20 "$work/phoenix.log" >&2
  exit 1
fi
echo "traces: Phoenix UI on $base (project 'default'); OTLP/HTTP at $base/v1/traces"

# Not `exec`: the EXIT trap must outlive the stack to stop Phoenix after Ctrl-C.
# The standard OpenTelemetry variables: the gateway samples every request and exports to
# Phoenix; the engines (vLLM's --otlp-traces-endpoint) export their own spans there too.
status=0
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="$base/v1/traces" OTEL_TRACES_SAMPLER_ARG=1 \
  .venv/bin/engine stack || status=$?
echo "traces: stopping Phoenix; the traces stay in $work (open them with \`make traces\`)"
exit "$status"
