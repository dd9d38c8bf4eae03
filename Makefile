# Two entry points that work on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export OMP_NUM_THREADS ?= 1
# mkdocs-material prints an end-of-life banner on every build unless this is set.
export NO_MKDOCS_2_WARNING := 1

.PHONY: demo test bad-inputs bench lint typecheck docs docs-build pictures clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"

$(VENV)/.examples-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[examples]"
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@ $(VENV)/.examples-installed

demo: $(VENV)/.examples-installed
	$(BIN)/accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no \
		--dynamo_backend no examples/train_digits.py

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.dev-installed
	$(BIN)/mypy

docs-build: $(VENV)/.dev-installed
	$(BIN)/mkdocs build --strict

docs: $(VENV)/.dev-installed
	$(BIN)/mkdocs serve

# The documentation's pictures, from real runs (needs chromium: apt-get install -y chromium);
# tests/test_docs_pages.py checks that the pages show exactly the pictures it makes.
pictures: $(VENV)/.dev-installed
	$(BIN)/python scripts/generate_pictures.py

test: lint typecheck docs-build
	$(BIN)/python -m pytest

# The catalogue of bad inputs, each with its clear error or warning, in one command.
bad-inputs: $(VENV)/.dev-installed
	$(BIN)/python -m pytest -q -m bad_input

$(VENV)/.bench-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[bench]"
	touch $@

# Every suite; its results are written as each finishes (benchmarks/results/), and the figures
# of docs/performance.md are regenerated from them, also after a failed suite.
# `make bench BENCH_ARGS=--quick` for a smoke run (a few minutes).
bench: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS); status=$$?; \
		$(BIN)/python -m benchmarks.report; exit $$status

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache
