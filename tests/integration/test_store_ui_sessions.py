"""The inbox UI's browser sessions and sign-in counters, in every store of them (this
process's memory, SQLite, PostgreSQL): revocation, expiry, listing, and the shared failure
counters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from engine.remote.ui.browser_sessions import (
    BrowserSessionRecord,
    BrowserSessionStore,
    InMemoryBrowserSessions,
    new_session_id,
)
from stores.ui_sessions import SqlBrowserSessions
from tests.databases import sql_store

IDLE = timedelta(minutes=30)
WINDOW = timedelta(minutes=5)


def _session(principal: str = "alice", *, now: datetime | None = None) -> BrowserSessionRecord:
    at = now or datetime.now(UTC)
    return BrowserSessionRecord(
        id=new_session_id(),
        principal=principal,
        roles=("approver",),
        csrf="csrf-" + principal,
        created_at=at,
        last_seen_at=at,
        expires_at=at + timedelta(hours=8),
        user_agent="Firefox",
        client_address="10.0.0.1",
    )


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def sessions(request: pytest.FixtureRequest) -> AsyncIterator[BrowserSessionStore]:
    """A fresh store of browser sessions of each kind."""
    if request.param == "memory":
        yield InMemoryBrowserSessions()
        return
    async with sql_store(request.param) as store:
        yield SqlBrowserSessions(store.db)


async def test_a_session_reads_back_as_written(sessions: BrowserSessionStore) -> None:
    """A created session reads back with its principal, roles, CSRF token and browser."""
    written = _session()
    await sessions.create_browser_session(written)
    found = await sessions.get_browser_session(written.id)
    assert found is not None
    assert (found.principal, found.roles, found.csrf) == ("alice", ("approver",), "csrf-alice")
    assert (found.user_agent, found.client_address) == ("Firefox", "10.0.0.1")
    assert abs(found.expires_at - written.expires_at) < timedelta(milliseconds=1)
    assert found.live_at(datetime.now(UTC), IDLE)
    assert await sessions.get_browser_session("nobody") is None


async def test_revoking_one_session_ends_it_and_touch_no_longer_moves_it(
    sessions: BrowserSessionStore,
) -> None:
    """A revoked session is no longer live, cannot be touched, and a second revoke is a no-op."""
    kept, ended = _session(), _session()
    await sessions.create_browser_session(kept)
    await sessions.create_browser_session(ended)
    now = datetime.now(UTC)
    assert await sessions.revoke_browser_sessions(now=now, session_id=ended.id) == [ended.id]
    assert await sessions.revoke_browser_sessions(now=now, session_id=ended.id) == []
    found = await sessions.get_browser_session(ended.id)
    assert found is not None and found.revoked_at is not None
    assert not found.live_at(now, IDLE)
    assert not await sessions.touch_browser_session(ended.id, now=now)
    assert await sessions.touch_browser_session(kept.id, now=now + timedelta(seconds=5))
    touched = await sessions.get_browser_session(kept.id)
    assert touched is not None and touched.last_seen_at > kept.last_seen_at


async def test_revoking_a_principal_ends_all_its_sessions_only(
    sessions: BrowserSessionStore,
) -> None:
    """Revoking by principal ends every session of that principal and nobody else's."""
    first, second, other = _session("bob"), _session("bob"), _session("carol")
    for session in (first, second, other):
        await sessions.create_browser_session(session)
    revoked = await sessions.revoke_browser_sessions(now=datetime.now(UTC), principal="bob")
    assert sorted(revoked) == sorted([first.id, second.id])
    listed = await sessions.list_browser_sessions()
    assert [s.id for s in listed] == [other.id]
    with pytest.raises(ValueError):
        await sessions.revoke_browser_sessions(now=datetime.now(UTC))


async def test_idle_and_absolute_expiry_end_a_session(sessions: BrowserSessionStore) -> None:
    """A session unused for longer than the idle limit, or past its expiry, is not live."""
    old = datetime.now(UTC) - timedelta(hours=1)
    idle = _session(now=old)
    await sessions.create_browser_session(idle)
    found = await sessions.get_browser_session(idle.id)
    assert found is not None and not found.live_at(datetime.now(UTC), IDLE)
    assert found.live_at(old + timedelta(minutes=1), IDLE)
    expired = _session(now=datetime.now(UTC) - timedelta(hours=9))
    await sessions.create_browser_session(expired)
    assert not await sessions.touch_browser_session(expired.id, now=datetime.now(UTC))
    listed = await sessions.list_browser_sessions()
    assert expired.id not in [s.id for s in listed]
    recent = await sessions.list_browser_sessions(
        include_ended_after=datetime.now(UTC) - timedelta(days=1)
    )
    assert expired.id in [s.id for s in recent]


async def test_failures_count_up_within_a_window_and_restart_after_it(
    sessions: BrowserSessionStore,
) -> None:
    """Each attempt counts against every key; a key whose window ended starts again at 1."""
    start = datetime.now(UTC)
    for expected in (1, 2, 3):
        counts = await sessions.count_login_attempt(
            ["address:10.0.0.1", "account:alice"], now=start, window=WINDOW
        )
        assert sorted(c.failures for c in counts) == [expected, expected]
    later = start + WINDOW + timedelta(seconds=1)
    (count,) = await sessions.count_login_attempt(["account:alice"], now=later, window=WINDOW)
    assert count.failures == 1
    assert abs(count.window_started_at - later) < timedelta(milliseconds=1)


async def test_a_success_gives_back_the_address_and_clears_the_account(
    sessions: BrowserSessionStore,
) -> None:
    """Forgiving a successful attempt takes one off the address and deletes the account."""
    now = datetime.now(UTC)
    keys = ["address:10.0.0.2", "account:dave"]
    for _ in range(3):
        await sessions.count_login_attempt(keys, now=now, window=WINDOW)
    await sessions.forgive_login_attempt(give_back=["address:10.0.0.2"], clear=["account:dave"])
    counts = {
        c.key: c.failures for c in await sessions.count_login_attempt(keys, now=now, window=WINDOW)
    }
    assert counts == {"address:10.0.0.2": 3, "account:dave": 1}


async def test_concurrent_attempts_are_each_counted(sessions: BrowserSessionStore) -> None:
    """Attempts counted at the same time all land: the upsert loses none."""
    now = datetime.now(UTC)
    await asyncio.gather(
        *(
            sessions.count_login_attempt(["address:10.0.0.3"], now=now, window=WINDOW)
            for _ in range(8)
        )
    )
    (count,) = await sessions.count_login_attempt(["address:10.0.0.3"], now=now, window=WINDOW)
    assert count.failures == 9


async def test_a_sign_in_deletes_long_expired_sessions_and_old_counters(
    sessions: BrowserSessionStore,
) -> None:
    """Sessions expired over 30 days ago and day-old counters go when a browser signs in;
    recent ones stay."""
    now = datetime.now(UTC)
    ancient = _session(now=now - timedelta(days=40))
    recent = _session(now=now - timedelta(days=2))
    for session in (ancient, recent):
        await sessions.create_browser_session(session)
    await sessions.count_login_attempt(["address:old"], now=now - timedelta(days=2), window=WINDOW)
    await sessions.count_login_attempt(["address:new"], now=now, window=WINDOW)
    await sessions.create_browser_session(_session(now=now))
    assert await sessions.get_browser_session(ancient.id) is None
    assert await sessions.get_browser_session(recent.id) is not None
    counts = await sessions.count_login_attempt(
        ["address:old", "address:new"], now=now, window=WINDOW
    )
    assert {c.key: c.failures for c in counts} == {"address:old": 1, "address:new": 2}
