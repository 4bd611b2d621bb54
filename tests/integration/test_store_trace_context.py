"""The SessionStore contract on a turn's trace context: the W3C context of the request that
created it is kept with the turn and handed to whoever claims it.

Every test runs on each store of
:data:`~tests.integration.store_support.STORE_FACTORIES` (the ``store`` fixture).
"""

from __future__ import annotations

from engine.store import SessionStore
from tests.integration.store_support import answer, claim, new_turn, paused_turn

CONTEXT = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "congo=t61rcWkgMzE",
}


async def test_the_trace_context_is_created_read_and_claimed_with_the_turn(
    store: SessionStore,
) -> None:
    """create_turn keeps it; get_turn, the session's latest turn and both claims return it."""
    created = await store.create_turn(new_turn("t1", "s1", trace_context=CONTEXT))
    assert created.trace_context == CONTEXT
    assert (await store.get_turn("t1")) == created
    latest = await store.latest_turn("s1")
    assert latest is not None and latest.trace_context == CONTEXT
    assert (await claim(store, "t1")).trace_context == CONTEXT

    await store.create_turn(new_turn("t2", "s2", trace_context=CONTEXT))
    (claimed,) = await store.claim_next(owner="w2", lease_seconds=30)
    assert (claimed.turn.id, claimed.turn.trace_context) == ("t2", CONTEXT)


async def test_a_turn_created_outside_a_trace_has_none(store: SessionStore) -> None:
    """No context given: the turn reads ``None`` (not an empty object)."""
    created = await store.create_turn(new_turn("t1"))
    assert created.trace_context is None
    assert (await claim(store, "t1")).trace_context is None


async def test_a_resume_keeps_the_context_of_its_own_request(store: SessionStore) -> None:
    """A resume (the creation that answers interrupts) stores its own request's context; its
    parent keeps the one it was created with."""
    await paused_turn(store, "t1")
    resumed = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    created = await store.create_turn(
        new_turn("t2", kind="resume", parent_id="t1", history_length=1, trace_context=resumed),
        answers=[answer("t1", "r1")],
    )
    assert created.trace_context == resumed
    parent = await store.get_turn("t1")
    assert parent is not None and parent.trace_context is None
