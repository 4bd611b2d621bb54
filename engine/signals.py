"""A broadcast wake-up shared by the stores' change notifications."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["BroadcastSignal"]


class BroadcastSignal:
    """A wake-up for many waiters: every waiter at the time of :meth:`fire` returns.

    The event is created by the first waiter, inside its event loop, so a signal can be
    made anywhere (e.g. by a store built before the loop runs).
    """

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    def fire(self) -> None:
        """Wake every current waiter (later waiters wait for the next fire)."""
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, timeout: float) -> None:
        """Until the next :meth:`fire`, or ``timeout`` seconds."""
        if self._event is None:
            self._event = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
