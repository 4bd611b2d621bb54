"""Genkit's agent spec passes in full, on the Python API and over HTTP, on every store.

The cases and both drivers are in :mod:`tests.genkit_spec`. On memory the agents run their
turns in the caller (the server, over HTTP); on SQLite and PostgreSQL they are queued and a
worker pool runs them in the test process, as ``turnstile serve --workers`` does.
"""

from __future__ import annotations

import pytest

from tests.genkit_spec import CASES, Case, PythonDriver, http_driver, run_case, spec_app
from tests.integration.store_support import STORE_FACTORIES

STORES = sorted(STORE_FACTORIES)


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("case", CASES, ids=str)
async def test_on_the_python_api(case: Case, kind: str) -> None:
    """The spec case holds through the Python API."""
    async with STORE_FACTORIES[kind]() as store, spec_app(store, workers=kind != "memory") as app:
        await run_case(case, app, PythonDriver(app))


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("case", [c for c in CASES if not c.python_only], ids=str)
async def test_over_http(case: Case, kind: str) -> None:
    """The spec case holds over Genkit's HTTP protocol, against a real server."""
    async with (
        STORE_FACTORIES[kind]() as store,
        spec_app(store, workers=kind != "memory") as app,
        http_driver(app) as driver,
    ):
        await run_case(case, app, driver)
