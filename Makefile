# GridBid. `make run` and `make test` do all the set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
DEMO ?=
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: run test bench lint install chain-install clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing Python packages into $(VENV) (first run takes a few minutes)..."
	@$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	@$(PY) -m pip install --quiet --progress-bar on -e '.[server,agent,dev]'
	@touch $(STAMP)

$(NODE_STAMP): package.json
	@echo "Installing the dev chain (anvil) from npm..."
	@npm install --no-audit --no-fund --loglevel=error
	@touch $(NODE_STAMP)

install: $(STAMP) $(NODE_STAMP)

chain-install: $(NODE_STAMP)

run: install
	$(VENV)/bin/gridbid up --port $(PORT) $(if $(DEMO),--demo,)

test: install
	@bash tests/run.sh $(PYTEST_ARGS)

bench: install
	@$(PY) tests/bench/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) node_modules .gridbid
