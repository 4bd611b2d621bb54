"""Fixtures of the integration tier: ``store``, one fresh store of each implementation."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.store import SessionStore
from tests.integration.store_support import KNOWN_FAILURES, STORE_FACTORIES


@pytest.fixture(params=sorted(STORE_FACTORIES))
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    """A fresh, empty store of each implementation (a module may define its own ``store``)."""
    reason = KNOWN_FAILURES.get((request.param, request.function.__name__))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    async with STORE_FACTORIES[request.param]() as opened:
        assert isinstance(opened, SessionStore)
        yield opened
