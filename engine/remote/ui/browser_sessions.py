"""Signed-in browsers of the inbox UI, kept as rows, and the counters that limit sign-ins.

A browser that signs in gets a session row (:class:`BrowserSessionRecord`); its cookie carries
only the row's id, signed. Every request reads the row, so revoking it (logout, or an operator
running ``turnstile ui sessions revoke``) ends the session at once, in every server process
sharing the database, whoever holds a copy of the cookie. A session also ends when it has
been idle too long or reached its absolute expiry.

Failed sign-ins are counted per key (a client address, an account name) in fixed windows, in
the same database, so several server processes enforce one limit together. An attempt is
counted before the authenticator runs (one upsert, race-free across processes) and given back
when it succeeds; a success also clears the account's counter.

:class:`BrowserSessionStore` is the protocol; the SQL stores (``stores/ui_sessions.py``) and
:class:`InMemoryBrowserSessions` (which the in-memory store uses) implement it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = [
    "BrowserSessionRecord",
    "BrowserSessionStore",
    "InMemoryBrowserSessions",
    "LoginCount",
    "new_session_id",
]

#: Longest user agent kept with a session (the rest is cut: it is only a hint for operators).
MAX_USER_AGENT = 200
#: Sessions that expired longer ago than this are deleted when another browser signs in.
ENDED_SESSIONS_KEPT = timedelta(days=30)
#: Sign-in counters whose window started longer ago than this are deleted then too.
LOGIN_COUNTS_KEPT = timedelta(days=1)


def new_session_id() -> str:
    """A fresh, unguessable session id (URL-safe text)."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class BrowserSessionRecord:
    """One signed-in browser: who, with which roles and CSRF token, since when, until when
    (``expires_at``: the absolute end), last seen when, revoked when (``None``: not), and a
    summary of the browser (user agent, client address) for operators."""

    id: str
    principal: str
    roles: tuple[str, ...]
    csrf: str
    created_at: datetime
    last_seen_at: datetime
    expires_at: datetime
    revoked_at: datetime | None = None
    user_agent: str = ""
    client_address: str = ""

    def live_at(self, now: datetime, idle: timedelta) -> bool:
        """Whether the session may still be used at ``now`` (not revoked, not past its
        expiry, and used within ``idle``)."""
        return self.revoked_at is None and now < self.expires_at and now - self.last_seen_at < idle


@dataclass(frozen=True)
class LoginCount:
    """A sign-in counter: attempts not known to have succeeded in the window that started at
    ``window_started_at``."""

    key: str
    failures: int
    window_started_at: datetime


@runtime_checkable
class BrowserSessionStore(Protocol):
    """Where the inbox UI keeps browser sessions and sign-in counters."""

    async def create_browser_session(self, session: BrowserSessionRecord) -> None:
        """Insert a new session row, and delete, in the same transaction, the sessions that
        expired more than :data:`ENDED_SESSIONS_KEPT` before it was created and the sign-in
        counters older than :data:`LOGIN_COUNTS_KEPT`."""
        ...

    async def get_browser_session(self, session_id: str) -> BrowserSessionRecord | None:
        """The session row (revoked or expired ones too), or ``None``."""
        ...

    async def touch_browser_session(self, session_id: str, *, now: datetime) -> bool:
        """Record use of a live session: ``last_seen_at = now``. Guarded: only a session
        not revoked and not expired at ``now`` moves; returns whether it did."""
        ...

    async def revoke_browser_sessions(
        self,
        *,
        now: datetime,
        session_id: str | None = None,
        principal: str | None = None,
    ) -> list[str]:
        """Revoke the session ``session_id``, or every session of ``principal``, that is not
        revoked yet (``revoked_at = now``); return the ids revoked. Exactly one of the two
        must be given."""
        ...

    async def list_browser_sessions(
        self, *, principal: str | None = None, include_ended_after: datetime | None = None
    ) -> list[BrowserSessionRecord]:
        """Sessions newest first, of ``principal`` when given: those not revoked and not
        expired, plus those that ended after ``include_ended_after`` when given."""
        ...

    async def count_login_attempt(
        self, keys: Sequence[str], *, now: datetime, window: timedelta
    ) -> list[LoginCount]:
        """Count one sign-in attempt against each key, in one guarded upsert per key: a key
        whose window ended (or that has none) starts a new window with 1; otherwise its
        count goes up by 1. Returns the counters after the increment."""
        ...

    async def forgive_login_attempt(
        self, *, give_back: Sequence[str], clear: Sequence[str]
    ) -> None:
        """After a successful sign-in: take the attempt back from the ``give_back`` keys
        (never below zero) and delete the ``clear`` keys' counters."""
        ...


class InMemoryBrowserSessions:
    """:class:`BrowserSessionStore` in process memory: the web UI's own when it is given none."""

    def __init__(self) -> None:
        self._browser_sessions: dict[str, BrowserSessionRecord] = {}
        self._login_counts: dict[str, LoginCount] = {}

    async def create_browser_session(self, session: BrowserSessionRecord) -> None:
        """See :meth:`BrowserSessionStore.create_browser_session`."""
        if session.id in self._browser_sessions:
            raise ValueError(f"Browser session {session.id} already exists.")
        old = session.created_at - ENDED_SESSIONS_KEPT
        for found in list(self._browser_sessions.values()):
            if found.expires_at < old:
                del self._browser_sessions[found.id]
        stale = session.created_at - LOGIN_COUNTS_KEPT
        for count in list(self._login_counts.values()):
            if count.window_started_at < stale:
                del self._login_counts[count.key]
        self._browser_sessions[session.id] = session

    async def get_browser_session(self, session_id: str) -> BrowserSessionRecord | None:
        """See :meth:`BrowserSessionStore.get_browser_session`."""
        return self._browser_sessions.get(session_id)

    async def touch_browser_session(self, session_id: str, *, now: datetime) -> bool:
        """See :meth:`BrowserSessionStore.touch_browser_session`."""
        found = self._browser_sessions.get(session_id)
        if found is None or found.revoked_at is not None or found.expires_at <= now:
            return False
        self._browser_sessions[session_id] = replace(found, last_seen_at=now)
        return True

    async def revoke_browser_sessions(
        self,
        *,
        now: datetime,
        session_id: str | None = None,
        principal: str | None = None,
    ) -> list[str]:
        """See :meth:`BrowserSessionStore.revoke_browser_sessions`."""
        check_revoke_target(session_id, principal)
        revoked = []
        for found in list(self._browser_sessions.values()):
            if found.revoked_at is not None:
                continue
            if found.id == session_id or (principal is not None and found.principal == principal):
                self._browser_sessions[found.id] = replace(found, revoked_at=now)
                revoked.append(found.id)
        return revoked

    async def list_browser_sessions(
        self, *, principal: str | None = None, include_ended_after: datetime | None = None
    ) -> list[BrowserSessionRecord]:
        """See :meth:`BrowserSessionStore.list_browser_sessions`."""
        now = datetime.now(UTC)
        found = [
            s
            for s in self._browser_sessions.values()
            if (principal is None or s.principal == principal)
            and (
                (s.revoked_at is None and s.expires_at > now)
                or (include_ended_after is not None and ended_at(s) > include_ended_after)
            )
        ]
        return sorted(found, key=lambda s: (s.created_at, s.id), reverse=True)

    async def count_login_attempt(
        self, keys: Sequence[str], *, now: datetime, window: timedelta
    ) -> list[LoginCount]:
        """See :meth:`BrowserSessionStore.count_login_attempt`."""
        counted = []
        for key in keys:
            found = self._login_counts.get(key)
            if found is None or found.window_started_at <= now - window:
                found = LoginCount(key=key, failures=1, window_started_at=now)
            else:
                found = replace(found, failures=found.failures + 1)
            self._login_counts[key] = found
            counted.append(found)
        return counted

    async def forgive_login_attempt(
        self, *, give_back: Sequence[str], clear: Sequence[str]
    ) -> None:
        """See :meth:`BrowserSessionStore.forgive_login_attempt`."""
        for key in give_back:
            found = self._login_counts.get(key)
            if found is not None:
                self._login_counts[key] = replace(found, failures=max(0, found.failures - 1))
        for key in clear:
            self._login_counts.pop(key, None)


def ended_at(session: BrowserSessionRecord) -> datetime:
    """When the session ended or ends: revoked, else its absolute expiry."""
    return session.revoked_at if session.revoked_at is not None else session.expires_at


def check_revoke_target(session_id: str | None, principal: str | None) -> None:
    """Refuse a revocation naming neither or both of a session and a principal."""
    if (session_id is None) == (principal is None):
        raise ValueError("Revoke one session (its id) or every session of one principal.")
