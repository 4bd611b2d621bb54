"""A long-lived process waits on the settlement of thousands of turns; it keeps nothing for
a wait that is over.

Most waits on a turn's change notifications end without one (the turn had already settled
when it was read, or the wait timed out, or its task was cancelled), so state kept per
waited-on turn until its next notification would never be freed.
"""

from __future__ import annotations

import asyncio

from engine import Engine, FinishReason, ScriptedModel, TurnStatus
from engine.store import Transition
from stores.postgres import PostgresSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.integration.store_support import new_turn
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


async def test_a_change_committed_here_wakes_its_waiters_without_a_notification() -> None:
    """A waiter in the process that committed a turn's change is woken by the process
    itself: with no notification sent for the turn, the wait ends at once, not at its
    timeout; and the store's transitions announce themselves that way."""
    async with sql_store("postgres") as store:
        assert isinstance(store, PostgresSessionStore)
        await store._listener.wait_connected(5)
        waiting = asyncio.ensure_future(store.wait_for_change("t1", 30))
        await asyncio.sleep(0.05)
        assert not waiting.done()

        store._listener.changed_here("t1")
        await asyncio.wait_for(waiting, 5)

        announced: list[str] = []
        store._listener.changed_here = announced.append  # type: ignore[method-assign,assignment]
        await store.create_claimed_turn(new_turn("t2"), owner="w", lease_seconds=30)
        await store.transition(
            "t2",
            Transition(
                expected={TurnStatus.PENDING},
                new=TurnStatus.COMPLETED,
                lease_token=1,
                finish_reason=FinishReason.STOP,
            ),
        )
        assert announced == ["t2"]
