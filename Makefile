# Developer tasks. The virtual environment in .venv is rebuilt when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv test demo bench clean

venv: $(VENV)/.installed

# torch is pinned and installed first so pip takes the local CPU wheel, not a CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[test,bench]'
	touch $@

test: venv
	$(BIN)/pytest
	$(BIN)/ruff check .

demo: venv
	$(BIN)/python -m inference.demo

bench: venv
	set -e; for script in $(wildcard benchmarks/*.py); do $(BIN)/python "$$script"; done

clean:
	rm -rf build .pytest_cache .ruff_cache results demo_output
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
