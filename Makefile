# The two commands that matter: `make run` and `make test`. Each does its own set-up.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
# pip on this machine kind warns about every missing local index entry; keep logs readable.
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || true; }
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: run test check lint typecheck docs docs-serve unit integration engine-env schema engine-validate clean help bench-routing bench-sessions bench-tiers bench-tiers-stream bench-tiers-encoders bench-trimming bench-faults bench-telemetry traces browser phoenix-env frameworks-env clients-env bench manifests bench-redis bench-streams bench-hot-path

help:
	@echo "make run    - engines + gateway on http://127.0.0.1:8080 (Ctrl-C stops all)"
	@echo "make test   - the whole suite: lint, types, unit, contract and real-vLLM integration"
	@echo "make schema - regenerate policies/policy.schema.json from the policy models"
	@echo "make docs   - build the documentation site into .run/site (strict); make docs-serve previews it"
	@echo "make traces - make run, every request traced to Arize Phoenix on http://127.0.0.1:6006"
	@echo "make bench-telemetry - tracing's cost per request, end to end (about 3 min)"
	@echo "make bench-faults  - 200 streaming clients, a replica killed and restarted (about 2 min)"
	@echo "make bench-tiers   - learned tier router on RouteLLM labels, held out by group (about 3 min)"
	@echo "make bench-tiers-stream - the router learned from cascade outcomes on a GSM8K stream (about 20 s)"
	@echo "make bench-trimming     - trimming budgets against the fixed watermarks, design then report parts (about 1 min)"
	@echo "make bench-tiers-encoders - could a text encoder carry the router to GSM8K? (about 5 min once its env is built)"
	@echo "make bench-routing - trace replay, routing overhead, tau-bench on real vLLM (about 15 min)"
	@echo "make bench-scale-out - replay through 1-8 gateways, with and without shared placements (about 1 min)"
	@echo "make manifests     - render deploy/k8s/engines/ from the GPU engine profiles"
	@echo "make bench-redis   - Redis memory per 1,000 active sessions (about 1 min)"
	@echo "make bench-streams - how evenly a CPU vLLM replica sends a long stream (about 5 min)"
	@echo "make bench-hot-path - where the gateway's own time goes, step by step, in process, whole and streamed (about 2 min)"
	@echo "make bench  - overhead side by side: gateway, bare proxy, LiteLLM, vllm-router, Portkey (about 11 min)"

$(STAMP): pyproject.toml
	@echo "setup: gateway environment $(VENV)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip 2>&1 | $(QUIET_PIP)
	@$(BIN)/pip install --quiet --progress-bar off -e '.[dev]' 2>&1 | $(QUIET_PIP)
	@rm -f $(VENV)/.installed-*
	@touch $@

engine-env:
	@bash engine/setup-env.sh

run: $(STAMP) engine-env
	@$(BIN)/engine stack

lint: $(STAMP)
	@echo "lint: ruff"
	@$(BIN)/ruff check gateway engine tests
	@$(BIN)/ruff format --check gateway engine tests

typecheck: $(STAMP)
	@echo "types: mypy --strict"
	@$(BIN)/mypy

check: lint typecheck docs

# The documentation site (mkdocs.yml): strict, so a broken link or anchor fails `make test`.
# (NO_MKDOCS_2_WARNING: Material's banner about MkDocs' future, on every build.)
docs: $(STAMP)
	@echo "docs: mkdocs build --strict"
	@NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .run/site

docs-serve: $(STAMP)
	@NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The fast inner loop: tests/unit and tests/engine without the tests that start a process
# (`gateway serve`, fake engines, Chromium, Phoenix, redis-server) or need vLLM, so no env
# beyond the gateway's own. It keeps the tests marked `redis`, on the Redis this machine kind
# runs (or a redis-server of its own when none answers); `make unit-pure` leaves them out.
# Markers are set by tests/conftest.py; `make test` runs everything.
unit: $(STAMP)
	@$(BIN)/pytest -q -m "not engine and not process" tests/unit tests/engine

.PHONY: unit-pure
unit-pure: $(STAMP)
	@$(BIN)/pytest -q -m "not engine and not process and not redis" tests/unit tests/engine

integration: $(STAMP) engine-env browser phoenix-env frameworks-env
	@$(BIN)/pytest tests/integration -v

# Headless Chromium from Debian, for the dashboard's browser tests (Playwright drives it;
# no browser is downloaded).
browser:
	@command -v chromium >/dev/null || { echo "setup: installing Debian's chromium"; \
	  apt-get install -y -qq chromium >/dev/null 2>&1 \
	  || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; }

# CrewAI and AutoGen, driven through the gateway by tests/integration/test_frameworks.py
# (their own cached env: they pin their own openai, pydantic and protobuf).
frameworks-env:
	@bash tests/frameworks/env.sh

# Claude Code and Codex CLI (npm), driven through the gateway by
# tests/integration/test_coding_agents.py (cached outside the checkout, keyed by the pins).
clients-env:
	@bash tests/clients/env.sh

# Arize Phoenix, the real OTLP trace receiver of the trace tests (cached like vLLM's env).
phoenix-env:
	@bash deploy/observability/phoenix-env.sh

test: $(STAMP) engine-env browser phoenix-env frameworks-env clients-env check
	@$(BIN)/pytest -v --durations=10

MOONCAKE := ../shared/data/mooncake/synthetic_trace.jsonl

# Routing benchmarks (not tests): trace replay, decision overhead, tau-bench on real vLLM.
bench-routing: $(STAMP) engine-env
	@mkdir -p .run/bench
	@for m in 10000 2000; do \
	  echo "replay: Mooncake trace, 8 replicas x $$m blocks"; \
	  $(BIN)/gateway replay --trace $(MOONCAKE) --replicas 8 --cache-blocks $$m; \
	  $(BIN)/gateway replay --trace $(MOONCAKE) --replicas 8 --cache-blocks $$m --json > .run/bench/replay-$$m.json; \
	done
	@$(BIN)/python -m tests.bench.routing_overhead
	@$(BIN)/python -m tests.bench.tau_routing
	@.venv-engine/bin/python -m tests.bench.tau_floor

# Scale-out (issue 24): the trace replayed through K gateway routers behind a random
# balancer, each alone and sharing placements. The modelled lag is the publisher's flush
# interval (routing.sharing.flush_ms, 10 by default) plus the Redis XADD -> XREAD round
# trip's p99, measured first by stream_lag (5.5 ms at worst over three runs on 2026-12-03,
# hence 6): re-measure, then set.
SCALE_OUT_BATCH_MS ?= 10
SCALE_OUT_LAG_MS ?= 6
SCALE_OUT := --replicas 8 --cache-blocks 10000 --gateways 1,2,4,8 --sharing none,placements \
  --batch-ms $(SCALE_OUT_BATCH_MS) --lag-ms $(SCALE_OUT_LAG_MS)
.PHONY: bench-scale-out
bench-scale-out: $(STAMP)
	@mkdir -p .run/bench
	@$(BIN)/python -m gateway.offline.replay.stream_lag
	@echo "replay: Mooncake trace"
	@$(BIN)/gateway replay --trace $(MOONCAKE) $(SCALE_OUT)
	@$(BIN)/gateway replay --trace $(MOONCAKE) $(SCALE_OUT) --json > .run/bench/scale-out-mooncake.json
	@echo "replay: tau-bench airline conversations, turn by turn"
	@$(BIN)/python -m gateway.offline.replay.conversations --out .run/bench/tau-trace.jsonl
	@$(BIN)/gateway replay --trace .run/bench/tau-trace.jsonl --block-tokens 128 $(SCALE_OUT)
	@$(BIN)/gateway replay --trace .run/bench/tau-trace.jsonl --block-tokens 128 $(SCALE_OUT) \
	  --json > .run/bench/scale-out-tau.json

# Session checkpoint cost against the local Redis.
bench-sessions: $(STAMP)
	@$(BIN)/python -m tests.bench.checkpoint_write

# The learned tier router on RouteLLM labels, held out by group (about 3 min).
bench-tiers: $(STAMP)
	@$(BIN)/python -m tests.bench.route_eval

# Trimming budgets against the fixed watermarks, chosen on the design parts by a rule
# written first (about 1 min).
bench-trimming: $(STAMP)
	@$(BIN)/python -m tests.bench.coding_histories
	@$(BIN)/python -m tests.bench.trim_budgets

# The router learned only from the cascade's outcomes on a stream of GSM8K prompts.
bench-tiers-stream: $(STAMP)
	@$(BIN)/python -m tests.bench.gsm8k_stream

# Text encoders (MiniLM, and its static distillation) as router features, chosen on MMLU
# alone and then scored on GSM8K; torch lives in its own cached environment.
bench-tiers-encoders: $(STAMP)
	@bash tests/bench/encoders/env.sh
	@.venv-encoders/bin/python tests/bench/encoders/embed.py
	@$(BIN)/python -m tests.bench.route_encoders

# What telemetry costs a request: tracing off, at the default sampling, every request traced.
bench-telemetry: $(STAMP)
	@$(BIN)/python -m tests.bench.telemetry_overhead

# 200 streaming clients for 60 s, one replica killed at 20 s and restarted at 40 s.
bench-faults: $(STAMP)
	@$(BIN)/python -m tests.fault.load_run

schema: $(STAMP)
	@$(BIN)/gateway policy schema --out policies/policy.schema.json
	@$(BIN)/gateway policy reference --out docs/reference/policy.md

engine-validate: $(STAMP) engine-env
	@$(BIN)/engine validate

# Kubernetes manifests of the engine pools, rendered from the GPU profiles into deploy/k8s/engines/
# (a unit test fails while the committed ones differ from a fresh render).
manifests: $(STAMP)
	@$(BIN)/engine manifests

# Redis memory per 1,000 active sessions, from real tau-bench turns checkpointed into a private Redis.
bench-redis: $(STAMP)
	@$(BIN)/python -m tests.bench.redis_sizing

# Silences inside long streams read straight from real cpu-tiny replicas (no gateway).
bench-streams: $(STAMP) engine-env
	@$(BIN)/python -m tests.bench.stream_silences

clean:
	rm -rf .run $(VENV) .venv-engine .venv-phoenix .venv-encoders .venv-frameworks .mypy_cache .ruff_cache .pytest_cache

# `make run` with every request traced to a local Arize Phoenix UI (dev only; Ctrl-C stops all).
traces: $(STAMP) engine-env phoenix-env
	@bash deploy/observability/traces.sh

# Where the gateway's own time goes on one request: each step of the request path timed in
# process, in front of the same mock engine as `make bench`.
bench-hot-path: $(STAMP)
	@$(BIN)/python -m tests.bench.hot_path
	@$(BIN)/python -m tests.bench.hot_path --stream --out .run/bench/hot-path-stream.json

# What the gateway adds to a request beside a bare proxy and peer gateways (LiteLLM,
# vllm-router, Portkey), all in front of one mock engine; peers in their own cached envs.
# Ends with the tables docs/benchmarks/overhead.md shows, from the results file.
bench: $(STAMP)
	@bash tests/bench/overhead/peers-env.sh
	@$(BIN)/python -m tests.bench.overhead.run
	@$(BIN)/python -m tests.bench.overhead.summary
