"""Shared fixtures: an independent banking app per test."""

from __future__ import annotations

import pytest

from examples.banking import BankingApp, build

TEST_STATE_KEYS = {"test-key": "test-secret-0123456789abcdef"}


@pytest.fixture
def app() -> BankingApp:
    """A fresh banking example (own engine, own in-memory store, own transfer log)."""
    return build(state_keys=TEST_STATE_KEYS)
