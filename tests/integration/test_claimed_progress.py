"""The SessionStore contract on what a claim returns: each leased turn with its progress.

A worker runs a claimed turn from its parent's conversation and journal and its own rounds
and journal. Every claim (``claim_next``, ``claim_turn``, a settle's follow-on claim) returns
that progress with the turn, equal to what ``read_progress`` reads, so the worker makes no
read of its own between the claim and its first model call.

The contract tests run on each store of
:data:`~tests.integration.store_support.STORE_FACTORIES` (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio

from engine import Engine, ScriptedModel, TurnStatus
from engine.store import (
    ClaimedTurn,
    FollowOnClaim,
    RoundRecord,
    SessionStore,
    ToolCallStatus,
    Transition,
)
from tests.conftest import TEST_STATE_KEYS
from tests.integration.store_support import (
    AGENT,
    COMPLETED,
    LEASE,
    PENDING,
    SHORT_LEASE,
    answer,
    asks,
    claim,
    model_says,
    new_turn,
    paused_turn,
    tool_call,
)
from tests.integration.test_work_hints import eventually
from tests.support import record_calls
from workers import WorkerPool


async def assert_progress_as_read(store: SessionStore, claimed: ClaimedTurn) -> None:
    """The claim's progress of the turn is what ``read_progress`` reads of it now."""
    assert claimed.progress == await store.read_progress(claimed.turn.id)


async def resume_of(store: SessionStore, paused: str, session: str, resume: str) -> None:
    """A turn ``paused`` at ``r1`` in ``session``, and its resume ``resume`` answering it."""
    await paused_turn(store, paused, session)
    await store.create_turn(
        new_turn(resume, session, kind="resume", parent_id=paused, history_length=2),
        answers=[answer(paused, "r1")],
    )


async def test_a_claim_returns_each_resumed_turns_progress(store: SessionStore) -> None:
    """One claim of two resumes of different chains returns each with its own progress: its
    parent's conversation and journal (the answered call among it), as read_progress
    reads them."""
    await resume_of(store, "p1", "s1", "r1")
    await resume_of(store, "p2", "s2", "r2")

    claimed = await store.claim_next(owner="w", lease_seconds=LEASE, limit=5)

    assert sorted(c.turn.id for c in claimed) == ["r1", "r2"]
    for taken in claimed:
        await assert_progress_as_read(store, taken)
        parent = taken.turn.parent_id
        assert parent is not None
        statuses = {c.ref: c.status for c in taken.progress.parent_journal}
        assert statuses == {"done": ToolCallStatus.DONE, "r1": ToolCallStatus.ANSWERED}
        assert {c.turn_id for c in taken.progress.parent_journal} == {parent}
        conversation = taken.progress.parent_conversation
        assert [m.role for m in conversation] == ["user", "model"]
        assert conversation[0].text == f"message of {parent}"


async def test_a_retried_turn_is_claimed_with_the_round_its_crashed_worker_committed(
    store: SessionStore,
) -> None:
    """A worker dies (its lease runs out) after committing a round and journaling its call:
    the claim that takes the turn over returns that round and that call."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1", owner="w1", lease_seconds=SHORT_LEASE)
    await store.save_round(
        "t1",
        lease_token=first.lease_token,
        round=RoundRecord(round=1, messages=[asks("r1")], committed=True),
        calls=[tool_call("t1", 1, "r1")],
    )
    await asyncio.sleep(SHORT_LEASE * 3)

    taken = await store.claim_turn("t1", owner="w2", lease_seconds=LEASE)

    assert (taken.turn.lease_owner, taken.turn.attempts) == ("w2", 2)
    await assert_progress_as_read(store, taken)
    assert [(r.round, r.committed) for r in taken.progress.rounds] == [(0, True), (1, True)]
    assert [(c.ref, c.status) for c in taken.progress.journal] == [("r1", ToolCallStatus.DONE)]
    assert taken.progress.parent_conversation == []


async def test_a_follow_on_claim_returns_the_progress_of_the_turn_it_leased(
    store: SessionStore,
) -> None:
    """The turn a settle's claim leased comes with its progress too."""
    await store.create_turn(new_turn("first", "s1"))
    await resume_of(store, "p2", "s2", "next")
    token = (await claim(store, "first")).lease_token
    follow = FollowOnClaim(owner="w1", lease_seconds=LEASE, agents=[AGENT])

    await store.transition(
        "first",
        Transition(
            expected={PENDING},
            new=COMPLETED,
            lease_token=token,
            round=RoundRecord(round=1, messages=[model_says("done")], committed=True),
            then_claim=follow,
        ),
    )

    (taken,) = follow.claimed
    assert taken.turn.id == "next"
    await assert_progress_as_read(store, taken)
    assert [c.ref for c in taken.progress.parent_journal] == ["done", "r1"]


async def test_a_worker_runs_claimed_turns_without_reading_their_progress(
    store: SessionStore,
) -> None:
    """Turns claimed by a worker pool (its loop's claims and its settles' follow-on claims)
    run from the progress their claim returned: read_progress is never called."""
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    ai.define_agent(name=AGENT, store=store, execution="workers")
    reads = record_calls(store, "read_progress")
    for n in range(3):
        await store.create_turn(new_turn(f"t{n}", f"s{n}"))
    pool = WorkerPool(ai, store, concurrency=1, poll_interval=0.05, scheduler=False)
    async with pool:

        async def all_done() -> bool:
            turns = [await store.get_turn(f"t{n}") for n in range(3)]
            return all(t is not None and t.status is TurnStatus.COMPLETED for t in turns)

        await eventually(all_done)

    assert pool.claimed_total == 3
    assert reads == []
