# One task runner. `make demo` and `make test` each set up .venv first (Python 3.11+).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-all test-js lint bench setup

$(BIN)/cce: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(BIN)/cce

setup: $(BIN)/cce

## Ingest the sample conversation and show the context a model would receive.
demo: $(BIN)/cce
	$(BIN)/cce demo

## The whole test suite (fast tests, then the slow ones with the real model and a wheel build),
## then the JavaScript SDK's tests (node's test runner; the cross-language test runs this .venv).
test: $(BIN)/cce
	$(BIN)/ruff check cce_duck udfs tests benchmarks
	$(BIN)/python -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc
	cd cce_sdk_js && CCE_PYTHON=$(CURDIR)/$(BIN)/python npm test

test-js: $(BIN)/cce
	cd cce_sdk_js && CCE_PYTHON=$(CURDIR)/$(BIN)/python npm test

lint: $(BIN)/cce
	$(BIN)/ruff check cce_duck udfs tests benchmarks
	$(BIN)/mypy

bench: $(BIN)/cce
	$(BIN)/python benchmarks/speed.py --json benchmarks/results/speed.json
