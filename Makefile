# Turnstile — the two commands that matter: `make demo` and `make test`.
# Both create .venv when needed and install the project with its dev extras from scratch.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo tour test lint typecheck install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

tour: $(STAMP)
	$(PY) -m examples.tour

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: lint typecheck
	$(VENV)/bin/pytest

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .turnstile
