"""The SessionStore contract on a claimed creation: a turn created already leased to the
process that will run it.

A process with a free worker slot that creates a turn runs it itself. Creating it leased
(``create_claimed_turn``) spares the round trip of a claim and the work notification that
would wake every worker for a turn already taken. The lease is an ordinary one: while it
runs nobody else may claim the turn, and when its owner dies it expires and any worker
claims the turn as it claims any turn whose worker died.

The contract tests run on each store of
:data:`~tests.integration.store_support.STORE_FACTORIES` (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio

import pytest

from engine.errors import SessionBusyError, StaleTransitionError
from engine.store import SessionStore, ToolCallStatus
from engine.store.history import CLAIMED, LEASE_LOST, STATUS
from tests.integration.store_support import (
    AGENT,
    LEASE,
    PENDING,
    SHORT_LEASE,
    answer,
    assert_recent,
    claim,
    new_turn,
    paused_turn,
)


async def test_a_claimed_creation_leases_the_new_turn_to_its_creator(
    store: SessionStore,
) -> None:
    """The new turn is pending at its first attempt and lease token, held by its creator
    until its lease expires, and comes with the progress read_progress reads of it."""
    claimed = await store.create_claimed_turn(new_turn("t1"), owner="creator", lease_seconds=LEASE)

    turn = claimed.turn
    assert (turn.id, turn.status, turn.agent) == ("t1", PENDING, AGENT)
    assert (turn.attempts, turn.lease_token, turn.lease_owner) == (1, 1, "creator")
    assert_recent(turn.created_at)
    assert turn.lease_expires_at is not None
    assert abs((turn.lease_expires_at - turn.created_at).total_seconds() - LEASE) < 1
    assert await store.get_turn("t1") == turn
    assert claimed.progress == await store.read_progress("t1")
    assert [m.text for r in claimed.progress.rounds for m in r.messages] == ["message of t1"]


async def test_the_history_says_it_was_created_then_claimed_by_its_creator(
    store: SessionStore,
) -> None:
    """The timeline tells the same story as a creation followed by a worker's claim: the
    pending entry at attempt 0, then the creator's claim of attempt 1."""
    await store.create_claimed_turn(new_turn("t1"), owner="creator", lease_seconds=LEASE)

    entries = [(e.kind, e.attempt, e.actor, e.detail) for e in await store.timeline("t1")]

    assert entries[0][:3] == (STATUS, 0, None)
    assert entries[1] == (CLAIMED, 1, "creator", "claimed by creator (attempt 1)")
    assert len(entries) == 2


async def test_a_claimed_resume_answers_its_parent_and_carries_the_answer(
    store: SessionStore,
) -> None:
    """A resume created claimed answers its parent's interrupted call in the same
    transaction; its progress shows the parent's journal with the answer."""
    await paused_turn(store, "p1")

    claimed = await store.create_claimed_turn(
        new_turn("r1", kind="resume", parent_id="p1", history_length=2),
        answers=[answer("p1", "r1")],
        owner="creator",
        lease_seconds=LEASE,
    )

    statuses = {c.ref: c.status for c in claimed.progress.parent_journal}
    assert statuses == {"done": ToolCallStatus.DONE, "r1": ToolCallStatus.ANSWERED}
    assert [m.role for m in claimed.progress.parent_conversation] == ["user", "model"]
    assert claimed.progress == await store.read_progress("r1")


async def test_nobody_else_claims_the_turn_while_its_lease_runs(store: SessionStore) -> None:
    """The turn is taken: neither a claim by id nor a claim of the next turn leases it."""
    await store.create_claimed_turn(new_turn("t1"), owner="creator", lease_seconds=LEASE)

    with pytest.raises(StaleTransitionError):
        await claim(store, "t1", owner="other")
    assert await store.claim_next(owner="other", lease_seconds=LEASE) == []


async def test_a_dead_creators_turn_is_claimed_once_its_lease_expires(
    store: SessionStore,
) -> None:
    """The creator that never runs its turn (it died) loses it with its lease: a worker
    claims it as attempt 2, and the history says whose lease expired."""
    await store.create_claimed_turn(new_turn("t1"), owner="creator", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE * 3)

    (taken,) = await store.claim_next(owner="worker", lease_seconds=LEASE)

    assert (taken.turn.id, taken.turn.attempts, taken.turn.lease_token) == ("t1", 2, 2)
    kinds = [(e.kind, e.actor) for e in await store.timeline("t1")]
    assert kinds[-2:] == [(LEASE_LOST, "creator"), (CLAIMED, "worker")]


async def test_a_refused_claimed_creation_writes_nothing(store: SessionStore) -> None:
    """A claimed creation into a session with a running turn is refused as a creation is,
    and neither the turn nor its claim is written."""
    await store.create_turn(new_turn("t1"))

    with pytest.raises(SessionBusyError):
        await store.create_claimed_turn(
            new_turn("t2", parent_id="t1"), owner="creator", lease_seconds=LEASE
        )

    assert await store.get_turn("t2") is None
    assert await store.timeline("t2") == []
    current = await store.get_turn("t1")
    assert current is not None and current.attempts == 0 and current.lease_owner is None
