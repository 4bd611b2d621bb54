"""Handing a new turn to a worker slot of the creating process.

A process that creates a turn for the worker pool and also runs a pool of its own (``turnstile
serve --workers N``, an application embedding :class:`workers.WorkerPool`) need not send the
turn through the queue: when one of its slots is free, the turn is created already leased to
that pool (:meth:`engine.store.TurnQueue.create_claimed_turn`) and starts in the slot at once.
That spares the claim's round trip and commit and the work notification that would wake every
worker for a turn already taken. The lease is an ordinary one, so a crash of the process hands
the turn to another worker once it expires, as it would a claimed turn's. An inline agent's
caller, which runs its turns itself, has them created leased to it the same way
(:class:`CallerRuns`).

The engine knows pools only through :class:`LocalSlots` (a pool registers itself while it
runs), so it imports nothing of ``workers/``.
"""

from __future__ import annotations

from typing import Protocol

from engine.store import ClaimedTurn, SessionStore

__all__ = ["CallerRuns", "LocalSlots", "SlotReservation", "reserve_local_slot"]


class SlotReservation(Protocol):
    """A free slot of a pool, held for one turn about to be created."""

    @property
    def owner(self) -> str:
        """Who the turn is leased to: the pool's lease owner."""
        ...

    @property
    def lease_seconds(self) -> float:
        """How long the lease runs before it must be renewed."""
        ...

    def run(self, claimed: ClaimedTurn) -> None:
        """Start the created turn in the reserved slot (which it then holds until it ends)."""
        ...

    def release(self) -> None:
        """Give the slot back unused (the creation was refused or failed)."""
        ...


class LocalSlots(Protocol):
    """A worker pool running in this process, as the engine sees it."""

    async def reserve(
        self, *, store: SessionStore, agent: str, app_version: str | None
    ) -> SlotReservation | None:
        """A free slot for a turn of ``agent`` pinned to ``app_version`` in ``store``, held
        until run or released; ``None`` when this pool does not serve such a turn, is
        stopping, or has no slot free (the turn then goes through the queue)."""
        ...


class CallerRuns:
    """The reservation of a caller that runs the turn itself (an inline agent): the turn is
    created leased to the caller, who runs it from the returned claim; there is no slot to
    start it in or give back."""

    def __init__(self, owner: str, lease_seconds: float) -> None:
        self.owner = owner
        self.lease_seconds = lease_seconds

    def run(self, claimed: ClaimedTurn) -> None:
        """Nothing to start: the caller runs ``claimed`` once its creation returns."""

    def release(self) -> None:
        """Nothing to give back."""


async def reserve_local_slot(
    pools: list[LocalSlots], *, store: SessionStore, agent: str, app_version: str | None
) -> SlotReservation | None:
    """The first free slot any of ``pools`` offers for the turn, or ``None``."""
    for pool in list(pools):
        reservation = await pool.reserve(store=store, agent=agent, app_version=app_version)
        if reservation is not None:
            return reservation
    return None
