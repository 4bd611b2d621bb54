"""Waiting for a turn to settle, whichever process runs it.

Waits are woken by the store's change notifications and fall back to polling, because a
notification is only a hint: it may be missed, and a turn may be run by another process.
"""

from __future__ import annotations

import asyncio
import contextlib

from engine.errors import NotFoundError
from engine.status import ACTIVE_STATUSES
from engine.store import SessionStore, StoredSnapshot

__all__ = ["wait_settled"]


async def wait_settled(
    store: SessionStore,
    turn_id: str,
    *,
    agent: str,
    poll_interval: float,
    timeout: float | None = None,
    listening: asyncio.Future[None] | None = None,
) -> StoredSnapshot:
    """Wait until a turn settles and return it, with its conversation and journal (read
    together, in one round trip where the store can).

    Woken by the store's change notifications, re-checking every ``poll_interval`` seconds
    in case one was missed. Raises :class:`TimeoutError` after ``timeout``, and
    :class:`NotFoundError` (naming ``agent``) when the turn does not exist. ``listening``: a
    wait for the turn's change notification registered before the turn was created
    (nothing can have been missed): awaited first, without a read.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    if listening is not None:
        with contextlib.suppress(TimeoutError):  # past the deadline: raised below
            await asyncio.wait_for(listening, timeout)
    # The first check usually follows the settle's notification: read the turn whole. A
    # turn still running then is polled by its row alone (a long turn must not cost its
    # whole conversation every poll) and read whole once settled.
    whole = True
    while True:
        wait_for = poll_interval
        if deadline is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"Snapshot {turn_id} did not settle in {timeout}s.")
            wait_for = min(wait_for, remaining)
        # Listen before reading: a settlement that lands between the read and the wait
        # must still wake us (the waiter registers as soon as the read yields).
        waiter = asyncio.ensure_future(store.wait_for_change(turn_id, wait_for))
        try:
            if whole:
                stored = await store.read_snapshot(turn_id)
                turn = stored.turn if stored is not None else None
            else:
                stored, turn = None, await store.get_turn(turn_id)
            if turn is not None and turn.status not in ACTIVE_STATUSES:
                settled = stored or await store.read_snapshot(turn_id)
                if settled is not None:
                    return settled
                turn = None  # gone since (pruned)
            if turn is None:
                raise NotFoundError(f"Snapshot '{turn_id}' not found for agent '{agent}'.")
            whole = False
            await waiter
        finally:
            waiter.cancel()
