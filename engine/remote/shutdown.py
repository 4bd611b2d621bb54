"""The notice that this process's server is stopping, for the waits that would hold it up.

An ASGI server stopping gracefully waits for every open response, and two kinds never end by
themselves: a request waiting for a worker to take its queued turn, and a browser's event
stream. Both end when told: the request answers that the turn goes on in the workers (it is in
the store), the stream closes and the browser reconnects elsewhere. The server's signal
handler calls :func:`begin_shutdown`; nothing resets it, as a process stops only once.
"""

from __future__ import annotations

import asyncio

__all__ = ["begin_shutdown", "shutting_down", "until_shutdown"]

_started = False
_waiters: set[asyncio.Future[None]] = set()


def begin_shutdown() -> None:
    """Tell every wait of this process that the server is stopping (safe from a signal
    handler, or from another thread)."""
    global _started
    _started = True
    for waiter in list(_waiters):
        waiter.get_loop().call_soon_threadsafe(_wake, waiter)


def shutting_down() -> bool:
    """Whether :func:`begin_shutdown` has been called."""
    return _started


async def until_shutdown() -> None:
    """Return once the server is stopping (at once if it already is)."""
    if _started:
        return
    waiter = asyncio.get_running_loop().create_future()
    _waiters.add(waiter)
    try:
        await waiter
    finally:
        _waiters.discard(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
