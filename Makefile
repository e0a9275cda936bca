# The two commands of the README: `make run` and `make test` (ruff, mypy, then pytest).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
# The chart tests' helm (tests/deploy): pinned, checksummed, fetched by deploy/fetch-helm.sh.
HELM := .cache/helm/helm

.PHONY: run test lint bench clean helm tmux

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml requirements.lock | $(BIN)/python
	$(BIN)/pip install --quiet -c requirements.lock -e .
	touch $@

$(STAMP_DEV): pyproject.toml requirements.lock | $(BIN)/python
	$(BIN)/pip install --quiet -c requirements.lock -e '.[dev]'
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

# Every benchmark script in turn; results are recorded in docs/benchmarks.md.
bench: $(STAMP_DEV)
	for script in benchmarks/bench_*.py; do echo "## $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .cache
