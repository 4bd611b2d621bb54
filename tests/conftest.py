"""Shared fixtures: an independent banking app per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from examples.banking import BankingApp, build

TEST_STATE_KEYS = {"test-key": "test-secret-0123456789abcdef"}


@pytest.fixture
def app() -> BankingApp:
    """A fresh banking example (own engine, own in-memory store, own transfer log)."""
    return build(state_keys=TEST_STATE_KEYS)


@pytest.fixture(scope="session", autouse=True)
def _drop_test_databases() -> Iterator[None]:
    """Drop the template databases this run created."""
    yield
    from tests import databases

    databases.cleanup()
