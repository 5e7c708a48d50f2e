# trainflow: every target sets up what it needs (uv, then the locked environment).
SHELL := /bin/bash
export UV_CACHE_DIR ?= $(HOME)/.cache/uv
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
VENV := .venv
PY := $(VENV)/bin/python
RUN := $(UV) run --frozen --extra dev

.PHONY: setup demo test test-fast lint typecheck fmt components check-components e2e bench clean

$(UV):
	python3 -m pip install --user --quiet 'uv>=0.5'

setup: $(UV)
	$(UV) sync --frozen --extra dev -p 3.11

lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .

fmt: setup
	$(RUN) ruff check --fix .
	$(RUN) ruff format .

typecheck: setup
	$(RUN) mypy -p trainflow.core

test-fast: setup
	$(RUN) pytest -m "not e2e" -q

test: lint typecheck test-fast

demo: setup
	$(RUN) python dags_examples/demo.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
