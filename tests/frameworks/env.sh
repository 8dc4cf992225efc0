#!/usr/bin/env bash
# Create (or reuse) the agent frameworks' virtual environment (CrewAI, AutoGen), cached
# outside the checkout and keyed by its requirements file, then link it as
# .venv-frameworks (deploy/cached-venv.sh). Test-only; no network once built.
set -euo pipefail
cd "$(dirname "$0")/../.."

exec bash deploy/cached-venv.sh frameworks tests/frameworks/requirements.txt \
  .venv-frameworks \
  'import crewai, autogen_agentchat, autogen_ext.models.openai' \
  "CrewAI and AutoGen: about 2 minutes, 1 GB"
