"""The engine's behaviour suite, re-run with the banking app on the SQL stores.

The test functions are the unit tier's (imported, so pytest collects them here too); the
``app`` fixture below overrides the in-memory one, so every test that takes ``app`` runs on
SQLite and on PostgreSQL with the turn executed in this process against the durable store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from examples.banking import BankingApp, build
from tests.behaviour_suite import *  # noqa: F403 - the suite, collected again here
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store


@pytest.fixture(params=["sqlite", "postgres"])
async def app(request: pytest.FixtureRequest) -> AsyncIterator[BankingApp]:
    """The banking app on a fresh SQL database, turns executed in this process."""
    async with sql_store(request.param) as store:
        yield build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
