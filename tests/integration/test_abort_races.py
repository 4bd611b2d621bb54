"""Aborts racing claims and settles: the status an abort reports is the one it caused, and
it never fails with a lost race.

On PostgreSQL the claims, settles and aborts run on separate connections at once, so they
race inside the database, as requests from separate processes do.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from engine.errors import StaleTransitionError
from engine.status import FinishReason, TurnStatus
from engine.store import AbortOutcome, SessionStore, Transition
from tests.integration.store_support import new_turn

TURNS = 60


async def run_workers(store: SessionStore, stop: asyncio.Event) -> None:
    """Claim turns one at a time and settle each at once, as a fast worker would."""
    while not stop.is_set():
        claimed = await store.claim_next(owner="w", lease_seconds=30)
        if not claimed:
            await asyncio.sleep(0)
            continue
        turn = claimed[0]
        await asyncio.sleep(random.uniform(0, 0.003))
        # Refused when the abort came first: the turn was aborted before this worker held it.
        with contextlib.suppress(StaleTransitionError):
            await store.transition(
                turn.turn.id,
                Transition(
                    expected={TurnStatus.PENDING, TurnStatus.ABORTING},
                    new=TurnStatus.COMPLETED,
                    lease_token=turn.turn.lease_token,
                    finish_reason=FinishReason.STOP,
                ),
            )


async def test_an_abort_reports_the_status_it_caused(store: SessionStore) -> None:
    """Aborts fired while workers claim and settle the turns: none raises; ``aborted`` only
    for a turn no worker ever held, ``aborting`` only for one a worker held, the reported
    status agrees with where the turn ends, and a moved turn was ``pending`` before."""
    for n in range(TURNS):
        await store.create_turn(new_turn(f"t{n}", f"s{n}"))
    stop = asyncio.Event()
    workers = [asyncio.create_task(run_workers(store, stop)) for _ in range(3)]

    async def abort(turn_id: str) -> AbortOutcome:
        await asyncio.sleep(random.uniform(0, 0.05))
        return await store.request_abort(turn_id)

    try:
        reported = await asyncio.gather(*(abort(f"t{n}") for n in range(TURNS)))
        for _ in range(400):
            turns = [await store.get_turn(f"t{n}") for n in range(TURNS)]
            if all(
                t is not None and t.status in (TurnStatus.COMPLETED, TurnStatus.ABORTED)
                for t in turns
            ):
                break
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.gather(*workers)

    for outcome, turn in zip(reported, turns, strict=True):
        assert turn is not None
        status = outcome.status
        moved = status is not outcome.previous
        assert not moved or outcome.previous is TurnStatus.PENDING, outcome
        if status is TurnStatus.ABORTED:
            assert (turn.status, turn.attempts) == (TurnStatus.ABORTED, 0), turn
        elif status is TurnStatus.ABORTING:
            assert turn.attempts == 1 and turn.status is TurnStatus.COMPLETED, turn
        else:
            assert status is TurnStatus.COMPLETED and turn.status is status, (status, turn)
