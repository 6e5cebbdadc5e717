# Set-up and everyday commands. Every target creates .venv when it is missing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DATA_DIR ?= ./data

.PHONY: run test lint proto bench crashtest clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "$(PYTHON) not found; set PYTHON=..."; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[bench,crashtest]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,bench,crashtest,spark]'
	touch $@

# `make run` starts the standalone broker (pulsar://127.0.0.1:6650) with its data in ./data.
run: $(VENV)/.installed-run
	$(BIN)/magnetar standalone --data-dir $(DATA_DIR)

# The suite runs on one pytest-xdist worker per core, up to 4, each test file whole on one worker;
# the Spark tests share one worker
# (and its one SparkSession). `.venv/bin/pytest tests/...` runs a part of it in one process.
test: $(VENV)/.installed-test
	$(BIN)/ruff check magnetar storage broker codec tests tools benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadgroup

lint: $(VENV)/.installed-test
	$(BIN)/ruff check magnetar storage broker codec tests tools benchmarks
	$(BIN)/mypy

# Regenerates codec/_proto/pulsar_api_pb2.py and .pyi from codec/_proto/pulsar_api.proto, with the
# protoc of grpcio-tools; tests/codec/test_proto.py fails when the committed files are stale.
proto: $(VENV)/.installed-test
	$(BIN)/python -m magnetar.codec._proto.generate

bench: $(VENV)/.installed-run
	$(BIN)/magnetar bench storage --json bench-storage.json --plot bench-storage.png

crashtest: $(VENV)/.installed-run
	$(BIN)/magnetar crashtest --data-dir $$(mktemp -d) --iterations 200 --mode both

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
