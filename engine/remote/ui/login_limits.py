"""Limits on failed sign-ins to the inbox UI, per client address and per account name.

Guessing tokens through the login form is slowed down: after ``limit`` failures in a window
(5 in 5 minutes by default) from one client address, or naming one account, the form answers
429 with ``Retry-After`` until the window ends, without asking the authenticator. The counters
live in the database (``ui_login_failures``), so every server process sharing it enforces one
limit; each attempt is counted before the authenticator runs and given back when it succeeds,
and a success clears the account's counter. Refusals are logged and counted in the metric
``turnstile_ui_login_failures_total`` (label ``reason``: ``refused`` or ``limited``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from engine.remote.ui.browser_sessions import BrowserSessionStore
from engine.telemetry import instruments

__all__ = [
    "DEFAULT_LOGIN_LIMIT",
    "DEFAULT_LOGIN_WINDOW_SECONDS",
    "LoginAttempt",
    "LoginLimiter",
]

#: Failures allowed per window, per address and per account.
DEFAULT_LOGIN_LIMIT = 5
#: The length of a window, in seconds.
DEFAULT_LOGIN_WINDOW_SECONDS = 300
#: Longest account name counted as typed (a longer one is cut: it is a key, not a name).
MAX_ACCOUNT = 200


@dataclass(frozen=True)
class LoginAttempt:
    """One counted sign-in attempt: its counter keys, and how long to wait when it is over
    the limit (``retry_after`` seconds; ``0``: it may go on)."""

    address_key: str
    account_key: str | None
    retry_after: int

    @property
    def limited(self) -> bool:
        """Whether the attempt is refused without asking the authenticator."""
        return self.retry_after > 0


class LoginLimiter:
    """Counts sign-in attempts in a
    :class:`~engine.remote.ui.browser_sessions.BrowserSessionStore`."""

    def __init__(
        self,
        store: BrowserSessionStore,
        *,
        limit: int = DEFAULT_LOGIN_LIMIT,
        window_seconds: int = DEFAULT_LOGIN_WINDOW_SECONDS,
    ) -> None:
        if limit < 1 or window_seconds < 1:
            raise ValueError("A sign-in limit needs at least 1 failure in at least 1 second.")
        self.store = store
        self.limit = limit
        self.window = timedelta(seconds=window_seconds)

    async def attempt(self, address: str, account: str | None) -> LoginAttempt:
        """Count an attempt from ``address`` naming ``account`` (``None``: none named)."""
        address_key = f"address:{address}"
        account_key = f"account:{account[:MAX_ACCOUNT]}" if account else None
        keys: Sequence[str] = [address_key] + ([account_key] if account_key else [])
        now = datetime.now(UTC)
        counts = await self.store.count_login_attempt(keys, now=now, window=self.window)
        over = [c for c in counts if c.failures > self.limit]
        retry_after = 0
        if over:
            ends = max(c.window_started_at for c in over) + self.window
            retry_after = max(1, math.ceil((ends - now).total_seconds()))
        return LoginAttempt(address_key, account_key, retry_after)

    async def succeeded(self, attempt: LoginAttempt, principal_id: str) -> None:
        """The attempt signed ``principal_id`` in: give it back, clear the account."""
        clear = [f"account:{principal_id[:MAX_ACCOUNT]}"]
        if attempt.account_key is not None:
            clear.append(attempt.account_key)
        await self.store.forgive_login_attempt(give_back=[attempt.address_key], clear=clear)


def report_failure(reason: str) -> None:
    """Count a refused sign-in in the metrics (``refused`` or ``limited``)."""
    instruments.ui_login_failure(reason)
