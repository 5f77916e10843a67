# Developer tasks. The virtual environment in .venv is rebuilt when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv test demo bench bench-check docs notebooks clean

venv: $(VENV)/.installed

# torch is pinned and installed first so pip takes the local CPU wheel, not a CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[test,bench,docs]'
	touch $@

test: venv
	$(MAKE) docs
	$(BIN)/pytest
	$(BIN)/ruff check .

demo: venv
	$(BIN)/python -m pyrogp_models.inference.demo

# The site in docs/_build/html, rebuilt from scratch; a warning (a broken cross-reference, a public
# symbol without a docstring, a notebook that does not render) fails the build.
docs: venv
	rm -rf docs/_build
	$(BIN)/sphinx-build -E -W --keep-going -q -b html docs docs/_build/html
	touch docs/_build/html/.clean-build

# Every notebook in notebooks/ run at full settings, its outputs (figures included) stored in the
# .ipynb (notebooks/execute.py); the tests run them in fast mode without writing them back.
notebooks: venv
	$(BIN)/python notebooks/execute.py

bench: venv
	set -e; for script in $(filter-out benchmarks/_% benchmarks/bench_check.py,$(wildcard benchmarks/*.py)); do $(BIN)/python "$$script"; done

# A quick subset of every benchmark (about 3 minutes), each time divided by a reference operation
# timed in the same run and compared with benchmarks/results/bench_check.json: fails on a
# slowdown beyond 1.5×. Run it before every commit that touches a model; after an intended change
# of cost, `$(BIN)/python benchmarks/bench_check.py --update` and commit the JSON.
bench-check: venv
	$(BIN)/python benchmarks/bench_check.py

clean:
	rm -rf build .pytest_cache .ruff_cache results demo_output
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
