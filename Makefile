# One-line entry points that set themselves up: `make demo`, `make test`.
# CI (.ci/run) runs `make test`, `make docs` and `make package-check`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(BIN)/.mlcache-installed

.PHONY: install demo test test-all lint docs package-check bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# the CPU wheel of torch first: a bare `torch` would pull a multi-GB CUDA build
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev,torch]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
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
