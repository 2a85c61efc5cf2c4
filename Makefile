# One-line entry points that set themselves up: `make demo`, `make test`.
# CI (.ci/run) runs `make test`, `make docs` and `make package-check`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(BIN)/.mlcache-installed

.PHONY: install demo test test-all lint docs package-check bench clean

DEMO_STAMP := $(BIN)/.mlcache-demo-installed

# pip speaks (no -q): a first `make demo` installs for a few minutes, and a silent
# one looks hung
$(BIN)/python:
	@echo "== creating the virtual environment $(VENV)"
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# what the demo needs: torch's CPU wheel first (a bare `torch` would pull a multi-GB
# CUDA build), then mlcache with tables, progress bars, the chart and joblib to compare
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@echo "== installing torch 2.13.0 (the CPU wheel, ~200 MB) and mlcache with the demo's extras (rich, tqdm, matplotlib, joblib)"
	$(BIN)/python -m pip install --progress-bar off torch==2.13.0
	$(BIN)/python -m pip install --progress-bar off -e ".[demo,torch]"
	touch $(DEMO_STAMP)

# everything the tests, the linters and the guide need
$(STAMP): pyproject.toml $(DEMO_STAMP)
	@echo "== installing the test tools (pytest, ruff, mypy, scikit-learn, pandas, pyarrow, dask, s3fs, a SeaweedFS server, mkdocs)"
	$(BIN)/python -m pip install --progress-bar off -e ".[dev,torch]"
	touch $(STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/mlcache demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q

docs: $(STAMP)
	@d=$$(mktemp -d); $(BIN)/mkdocs build --strict --site-dir "$$d"; rc=$$?; rm -rf "$$d"; \
	test $$rc = 0 && echo "docs: mkdocs build --strict passed"

# the wheel and sdist build, and the wheel alone runs `mlcache demo --quick` in a fresh venv
package-check: $(STAMP)
	PY=$(PY) BIN=$(BIN) bash .ci/package-check

test-all: lint
	$(BIN)/python -m pytest -q -m "slow or not slow"

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache site dist
