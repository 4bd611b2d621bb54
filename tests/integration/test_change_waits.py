"""A long-lived process waits on the settlement of thousands of turns; it keeps nothing for
a wait that is over.

Most waits on a turn's change notifications end without one (the turn had already settled
when it was read, or the wait timed out, or its task was cancelled), so state kept per
waited-on turn until its next notification would never be freed.
"""

from __future__ import annotations

import asyncio

from engine import Engine, ScriptedModel
from stores.postgres import PostgresSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from workers import WorkerPool


async def test_waiting_on_many_settlements_keeps_no_signal_behind() -> None:
    """After twenty sends that each waited for their turn to settle (on PostgreSQL, woken by
    NOTIFY) while a pool ran them, the store's listener keeps a signal for no turn."""
    async with sql_store("postgres") as store:
        ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
        agent = ai.define_agent(name="echo", store=store, execution="workers")
        async with WorkerPool(ai, store, concurrency=2, scheduler=False):
            for k in range(20):
                response = await agent.chat().send(f"hello {k}")
                assert response.text == f"Echo: hello {k}"
            await asyncio.sleep(0.05)  # cancelled waiters finish their clean-up
            # The listener's registry of waited-on turns (private: nothing public counts
            # them). Before KeyedSignals it held one entry per send here.
            assert isinstance(store, PostgresSessionStore)
            assert len(store._listener._changes) == 0
