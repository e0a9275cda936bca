# The two commands of the README: `make run` and `make test` (ruff, mypy, then pytest).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
# The chart tests' helm (tests/deploy): pinned, checksummed, fetched by deploy/fetch-helm.sh.
HELM := .cache/helm/helm

.PHONY: run test lint bench clean helm tmux vllm-parity test-readme

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml requirements.lock | $(BIN)/python
	$(BIN)/pip install --quiet -c requirements.lock -e .
	touch $@

# xds-protos ships a stale copy of opentelemetry-proto's modules (InstrumentationLibrary, not
# InstrumentationScope) under the same import path, and whichever is installed last wins
# (grpc/grpc#42926): opentelemetry-proto is installed again, alone, so the OTLP exporter can import.
$(STAMP_DEV): pyproject.toml requirements.lock | $(BIN)/python
	$(BIN)/pip install --quiet -c requirements.lock -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps --force-reinstall -c requirements.lock opentelemetry-proto
	touch $@ $(STAMP_RUN)

run: $(STAMP_RUN)
	$(BIN)/slorouter serve $(ARGS)

lint: $(STAMP_DEV)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

$(HELM): deploy/fetch-helm.sh
	PYTHON=$(PYTHON) bash deploy/fetch-helm.sh

helm: $(HELM)

# The terminal test of `slorouter top` (tests/top/test_top_tmux.py) runs it in tmux: Debian's package, installed
# when missing and this is root (otherwise that test is skipped, saying so).
tmux:
	@command -v tmux >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq tmux; } \
		|| echo "tmux is not installed: the terminal test of slorouter top will be skipped (apt-get install tmux)"

test: lint $(HELM) tmux
	SLOROUTER_HELM=$(abspath $(HELM)) $(BIN)/pytest

# The README followed as a new user would (tests/readme): a copy of this tree in .cache, installed the way
# `make run` installs it (the base package, no extras), its commands run as written in a network namespace of
# their own (so its ports are the README's). Run by .ci/run after `make test`.
README_CHECKOUT := .cache/readme-checkout

test-readme: $(STAMP_DEV)
	$(BIN)/python -m tests.readme.checkout $(README_CHECKOUT)
	$(MAKE) --no-print-directory -C $(README_CHECKOUT) .venv/.installed-run
	SLOROUTER_README_CHECKOUT=$(abspath $(README_CHECKOUT)) $(BIN)/pytest tests/readme

# vLLM's own block hashing asked directly (tests/kvevents/vllm_reference.py), not only the vectors it recorded
# in tests/kvevents/data: vLLM's wheel without its dependencies (about 340 MB, no torch) in .cache, then the
# parity tests against it (Hypothesis-generated prompts included). Not part of `make test`.
VLLM_VERSION := 0.33.0
VLLM_SITE := .cache/vllm-$(VLLM_VERSION)

$(VLLM_SITE)/vllm: | $(BIN)/python
	$(BIN)/pip install --quiet --no-deps --target $(VLLM_SITE) vllm==$(VLLM_VERSION)

vllm-parity: $(STAMP_DEV) $(VLLM_SITE)/vllm
	SLOROUTER_VLLM_SITE=$(abspath $(VLLM_SITE)) $(BIN)/pytest tests/kvevents/test_vllm_hash.py \
		tests/scheduling/test_precise_prefix_vllm.py

# Every benchmark script in turn; results are recorded in docs/benchmarks.md.
bench: $(STAMP_DEV)
	for script in benchmarks/bench_*.py; do echo "## $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .cache
