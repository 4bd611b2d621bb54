"""On PostgreSQL the common path of an approval workflow writes with single statements.

Creating a turn, claiming it, saving a round and settling are each one statement
(``stores/turn_creation.py``, ``stores/turn_claims.py``, ``stores/fenced.py``); a refused one
reports what it found, and the store raises the precise error from that. These tests pin
that the common path opens no transaction on the store's writing pool: neither a whole
send → approve → transfer workflow nor a refused write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from engine import FinishReason, TurnStatus
from engine.errors import ApprovalNotPendingError, LeaseLostError
from engine.store import InterruptAnswer, NewTurn, RoundRecord, Transition, TurnInput
from examples.banking import BankingApp, build
from stores import SqlSessionStore, snapshots
from stores import turn_claims as claim_sql
from stores import turn_creation as creation_sql
from stores import turns as turn_sql
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.support import record_calls
from workers import WorkerPool


@pytest.fixture
async def store() -> AsyncIterator[SqlSessionStore]:
    async with sql_store("postgres") as store:
        yield store


def count_transactions(store: SqlSessionStore) -> list[Any]:
    """Every transaction begun on the store's writing pool from now on (autocommit
    statements run on the other pool and begin none)."""
    begun: list[Any] = []
    sa.event.listen(store.db.engine, "begin", begun.append)
    return begun


async def approve_a_transfer(app: BankingApp, amount: int) -> str:
    chat = app.banking_agent.chat()
    paused = await chat.send(f"Transfer ${amount} to acct {amount}")
    approval = next(i for i in paused.interrupts if i.name == "userApproval")
    done = await chat.resume(respond=[approval.respond({"approved": True})])
    return done.text


async def test_an_approval_workflow_opens_no_transaction(store: SqlSessionStore) -> None:
    """Send, pause, approve, transfer, done — through a worker pool — with every write a
    single autocommit statement: no transaction is begun on the writing pool."""
    app = build(store=store, state_keys=TEST_STATE_KEYS)
    async with WorkerPool(app.ai, store, concurrency=2, scheduler=False):
        await approve_a_transfer(app, 1)  # warm: pools connected, statements prepared
        begun = count_transactions(store)
        texts = [await approve_a_transfer(app, amount) for amount in (2, 3)]

    assert texts == ["Done. Transaction txn-2-acct-2.", "Done. Transaction txn-3-acct-3."]
    assert begun == []


async def test_a_claims_progress_read_travels_in_the_claims_round_trip(
    store: SqlSessionStore,
) -> None:
    """Through a worker pool, each turn of an approval workflow is leased with its progress
    in the round trip that leases it (a claim, or a creation leased to this process's pool,
    then the progress read, in one pipeline): no round trip of the store's carries a
    progress read alone."""
    app = build(store=store, state_keys=TEST_STATE_KEYS)
    async with WorkerPool(app.ai, store, concurrency=2, scheduler=False):
        await approve_a_transfer(app, 1)  # warm: pools connected, statements prepared
        trips = record_calls(store.db.pg, "fetch_together")
        texts = [await approve_a_transfer(app, amount) for amount in (2, 3)]

    assert texts == ["Done. Transaction txn-2-acct-2.", "Done. Transaction txn-3-acct-3."]
    sent = [[statement for statement, _ in call.args[0]] for call in trips]
    leasing = {*claim_sql._CHECKED_CLAIMS.values()}
    leasing |= {statement for (*_, leased), statement in creation_sql._CREATE.items() if leased}
    progress = [trip for trip in sent if claim_sql.CLAIMED_PROGRESS in trip]
    # Two turns per workflow (the send and the resume), each leased once.
    assert len(progress) >= 4
    for trip in progress:
        at = trip.index(claim_sql.CLAIMED_PROGRESS)
        assert at > 0 and trip[at - 1] in leasing, "the progress read follows its lease"
    assert not any(snapshots._PROGRESS in trip for trip in sent)


async def paused_transfer(
    store: SqlSessionStore, amount: int
) -> tuple[InterruptAnswer, Callable[[str], NewTurn]]:
    """An inline banking chat paused at its approval: the answer approving it, and a maker
    of resume turns (by id) continuing that snapshot."""
    app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
    paused = await app.banking_agent.chat().send(f"Transfer ${amount} to acct {amount}")
    approval = next(i for i in paused.interrupts if i.name == "userApproval")
    parent = str(paused.snapshot_id)
    answer = InterruptAnswer(
        turn_id=parent, round=1, ref=str(approval.ref), answer={"respond": {"approved": True}}
    )

    def resume(turn_id: str) -> NewTurn:
        return NewTurn(
            id=turn_id,
            session_id=paused.session_id,
            agent="bankingAgent",
            parent_id=parent,
            input=TurnInput(kind="resume"),
            history_length=1,
        )

    return answer, resume


async def test_a_refused_one_statement_write_reports_why_without_a_transaction(
    store: SqlSessionStore,
) -> None:
    """A second resume answering what was answered already, and a round saved under a lost
    lease: the one statement writes nothing and reports what it found, from which the store
    raises the precise error (no transaction follows, and the store is unchanged)."""
    answer, resume = await paused_transfer(store, 9)
    first = await store.create_turn(resume("first"), answers=[answer])
    claimed = await store.claim_turn(first.id, owner="test", lease_seconds=30)
    await store.transition(
        first.id,
        Transition(
            expected={TurnStatus.PENDING},
            new=TurnStatus.COMPLETED,
            lease_token=claimed.turn.lease_token,
            finish_reason=FinishReason.STOP,
        ),
    )
    begun = count_transactions(store)

    with pytest.raises(ApprovalNotPendingError):
        await store.create_turn(resume("second"), answers=[answer])
    assert begun == []
    assert await store.get_turn("second") is None

    with pytest.raises(LeaseLostError):
        await store.save_round(
            first.id,
            lease_token=claimed.turn.lease_token,
            round=RoundRecord(round=1, messages=[], committed=True),
        )
    assert begun == []
    assert await store.load_rounds(first.id) == []


async def test_claims_and_heartbeats_update_the_turn_row_in_place(store: SqlSessionStore) -> None:
    """A claim and its heartbeats change no indexed column of ``turns`` and find room on the
    row's page, so PostgreSQL updates the row in place (HOT): no new index entries, nothing
    for later claims to step over (migration 0004)."""
    await store.create_turn(
        NewTurn(id="t1", session_id="s1", agent="a", input=TurnInput(kind="retry"))
    )
    hot_updates = sa.text(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'turns'"
    )
    now = datetime.now(UTC)
    # One transaction, so the per-transaction counters see exactly these three updates.
    with store.db.transaction() as connection:
        request = claim_sql.ClaimRequest(owner="w", lease_seconds=30, now=now, limit=1)
        (claimed,) = claim_sql.claim(connection, request)
        for beat in (1, 2):
            turn_sql.renew(
                connection, "t1", claimed.turn.lease_token, 30, now + timedelta(seconds=beat)
            )
        updates, hot = connection.execute(hot_updates).one()

    assert (updates, hot) == (3, 3)
