# Two entry points, as in the README's quick start.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

$(BIN)/forensics: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/forensics

.PHONY: setup demo test lint docs wheel-check
setup: $(BIN)/forensics

demo: setup  ## set up, then run the main job on the bundled data
	$(BIN)/forensics demo --out demo-out

test: setup  ## set up, then run the tests
	$(BIN)/pytest -q -n auto --dist loadfile

lint: setup  ## ruff, the layers of docs/architecture.md (import-linter) and mypy; all configured in pyproject.toml
	$(BIN)/ruff check forensics parsers tests benchmarks tools
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

docs: setup  ## regenerate the table reference, docs/tables.md, from forensics/schema.py
	$(BIN)/python -m tools.docs --write

wheel-check: setup  ## build the wheel, install it into a clean virtualenv, use it from outside the checkout, uninstall it
	$(BIN)/python -m tools.wheel_check
