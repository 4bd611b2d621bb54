# Turnstile — the two commands that matter: `make demo` and `make test`.
# Both create .venv when needed and install the project with its dev extras from scratch.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# The genuine Genkit JS client the acceptance tests drive our server with (installed locally).
JS_STAMP := tests/js/node_modules/.installed-stamp

# The browser the inbox UI's acceptance tests drive (Debian's package; see docs/inbox.md).
CHROMIUM ?= /usr/bin/chromium

# Test processes for `make test` and `make test-fast`. Most of an acceptance test's time is
# spent waiting on the processes it started, so two run well on two cores; a file's tests stay
# in one process, where its module-scoped servers and databases are shared.
TEST_PROCESSES ?= 2
PARALLEL := -n $(TEST_PROCESSES) --dist loadfile

.PHONY: demo tour test test-unit test-fast lint typecheck install browser clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Installs Debian's chromium when it is missing and we may (root); otherwise says how.
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium (Debian package)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
	  echo "$(CHROMIUM) is missing: run 'sudo apt-get install chromium' (the browser tests skip without it)"; \
	fi

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	cd tests/js && npm ci --no-audit --no-fund --loglevel=error
	touch $(JS_STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

tour: $(STAMP)
	$(PY) -m examples.tour

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: lint typecheck $(JS_STAMP) browser
	$(VENV)/bin/pytest $(PARALLEL)

# The edit-test loop: the unit tier only (no database, no processes), in seconds.
# (tests/unit also holds the behaviour suite's other backends, marked with their tier.)
test-unit: $(STAMP)
	$(VENV)/bin/pytest tests/unit -m "not integration and not acceptance"

# Unit and integration tiers, no acceptance or perf tests (needs PostgreSQL, see tests/README.md).
test-fast: $(STAMP)
	$(VENV)/bin/pytest $(PARALLEL) -m "not acceptance and not perf"

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .turnstile tests/js/node_modules
