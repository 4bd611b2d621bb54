"""On PostgreSQL a refused write says why in its own result.

Each hot write (create a turn, save a round, settle) is one statement that writes only when
its rules hold; when one does not, the statement reports what it found and the store raises
the typed error naming the rule, with nothing written and no second transaction to find out.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Sequence

import pytest

from engine.errors import (
    ApprovalNotPendingError,
    DecisionConflictError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    SessionBusyError,
    StaleSnapshotError,
    StaleTransitionError,
)
from engine.status import FinishReason, TurnStatus
from engine.store import (
    InterruptAnswer,
    NewTurn,
    RoundRecord,
    ToolCallRecord,
    ToolCallStatus,
    Transition,
    TurnInput,
    TurnRecord,
)
from stores import SqlSessionStore
from stores.postgres import PostgresSessionStore
from stores.sqlite import SqliteSessionStore
from tests.databases import sql_store
from tests.integration.store_support import record_decision
from tests.integration.test_round_trips import count_transactions


@pytest.fixture
async def store() -> AsyncIterator[SqlSessionStore]:
    async with sql_store("postgres") as store:
        yield store


def new_turn(turn_id: str, session: str = "s", **fields: object) -> NewTurn:
    return NewTurn.model_validate(
        {"id": turn_id, "session_id": session, "agent": "a", "input": TurnInput(kind="retry")}
        | fields
    )


async def leased(store: SqlSessionStore, turn_id: str, session: str = "s") -> TurnRecord:
    await store.create_turn(new_turn(turn_id, session))
    return (await store.claim_turn(turn_id, owner="w", lease_seconds=30)).turn


def settle(
    lease_token: int | None,
    *,
    expected: frozenset[TurnStatus] = frozenset({TurnStatus.PENDING}),
    new: TurnStatus = TurnStatus.COMPLETED,
    calls: Sequence[ToolCallRecord] = (),
    finish_reason: FinishReason = FinishReason.STOP,
) -> Transition:
    return Transition(
        expected=expected,
        new=new,
        lease_token=lease_token,
        finish_reason=finish_reason if new is TurnStatus.COMPLETED else None,
        calls=calls,
    )


async def paused(store: SqlSessionStore, session: str = "p") -> InterruptAnswer:
    """A settled turn with one interrupted call, and an answer approving it."""
    turn = await leased(store, "paused", session)
    call = ToolCallRecord(
        turn_id=turn.id,
        round=1,
        ref="r1",
        name="approve",
        status=ToolCallStatus.INTERRUPTED,
        idempotency_key="k1",
    )
    await store.transition(
        turn.id, settle(turn.lease_token, calls=[call], finish_reason=FinishReason.INTERRUPTED)
    )
    return InterruptAnswer(turn_id=turn.id, round=1, ref="r1", answer={"respond": True})


def test_the_store_of_a_url_is_its_databases_class(tmp_path: object) -> None:
    """``SqlSessionStore(url)`` makes the store class of the URL's database."""
    sqlite = SqlSessionStore(f"sqlite:///{tmp_path}/t.db")
    postgres = SqlSessionStore("postgresql://postgres@127.0.0.1/postgres")
    assert type(sqlite) is SqliteSessionStore
    assert type(postgres) is PostgresSessionStore
    assert repr(sqlite).startswith("SqliteSessionStore('sqlite:///")


def test_each_dialect_defines_every_operation_the_base_leaves_to_it() -> None:
    """Every method the base declares for the dialects is defined by both of them."""
    left = {
        name
        for name, member in vars(SqlSessionStore).items()
        if callable(member) and "raise NotImplementedError" in inspect.getsource(member)
    }
    assert {"create_turn", "transition", "_save_fenced", "read_progress"} <= left
    for dialect in (PostgresSessionStore, SqliteSessionStore):
        assert left - vars(dialect).keys() == set(), dialect


@pytest.mark.parametrize(
    ("setup", "request_turn", "error"),
    [
        ("other agent", new_turn("t2", agent="b"), InvalidArgumentError),
        ("other owner", new_turn("t2", parent_id="t1", owner="mallory"), NotFoundError),
        ("running turn", new_turn("t2", parent_id="t1"), SessionBusyError),
        ("taken id", new_turn("t1", parent_id="t1"), InvalidArgumentError),
        ("stale parent", new_turn("t3", parent_id="t1"), StaleSnapshotError),
        ("no parent", new_turn("t3"), StaleSnapshotError),
    ],
)
async def test_a_refused_creation_names_its_rule_and_writes_nothing(
    store: SqlSessionStore, setup: str, request_turn: NewTurn, error: type[Exception]
) -> None:
    """Each creation rule, broken on its own, raises its own error in one statement."""
    await store.create_turn(new_turn("t1", owner="alice"))
    if setup != "running turn":
        first = await store.claim_turn("t1", owner="w", lease_seconds=30)
        await store.transition("t1", settle(first.turn.lease_token))
    if setup in ("stale parent", "no parent"):
        await store.create_turn(new_turn("t2", parent_id="t1"))
        second = await store.claim_turn("t2", owner="w", lease_seconds=30)
        await store.transition("t2", settle(second.turn.lease_token))
    before = await store.latest_turn("s")
    begun = count_transactions(store)

    with pytest.raises(error):
        await store.create_turn(request_turn)

    assert begun == []
    assert await store.latest_turn("s") == before


@pytest.mark.parametrize(
    ("recorded", "answer", "error"),
    [
        ("answered", {"respond": True}, ApprovalNotPendingError),
        ("decided", {"respond": False}, DecisionConflictError),
        ("unknown", {"respond": True}, ApprovalNotPendingError),
    ],
)
async def test_a_refused_answer_names_its_rule_and_writes_nothing(
    store: SqlSessionStore, recorded: str, answer: object, error: type[Exception]
) -> None:
    """An answer to a call no longer pending, one contradicting an approver's recorded
    decision, and one naming no call are each refused, with the journal unchanged."""
    approve = await paused(store)
    if recorded == "answered":
        await store.create_turn(new_turn("first", "p", parent_id="paused"), answers=[approve])
        first = await store.claim_turn("first", owner="w", lease_seconds=30)
        await store.transition("first", settle(first.turn.lease_token))
    elif recorded == "decided":
        await record_decision(store, "paused", 1, "r1", answer=approve.answer, decided_by="bob")
    elif recorded == "unknown":
        approve = approve.model_copy(update={"ref": "r9"})
    journal = await store.list_calls("paused")
    begun = count_transactions(store)

    with pytest.raises(error):
        await store.create_turn(
            new_turn("second", "p", parent_id="paused"),
            answers=[approve.model_copy(update={"answer": answer})],
        )

    assert begun == []
    assert await store.list_calls("paused") == journal
    assert await store.get_turn("second") is None


async def test_a_refused_settle_names_its_rule_and_writes_nothing(store: SqlSessionStore) -> None:
    """A settle of a missing turn, under a lost lease, from a status not expected, and
    along no edge of the state machine: each its own error, the turn unchanged."""
    await leased(store, "t1")
    await store.request_abort("t1")
    aborting = await store.get_turn("t1")
    assert aborting is not None and aborting.status is TurnStatus.ABORTING
    token, only_aborting = aborting.lease_token, frozenset({TurnStatus.ABORTING})
    begun = count_transactions(store)

    with pytest.raises(StaleTransitionError, match="does not exist"):
        await store.transition("nobody", settle(1))
    with pytest.raises(LeaseLostError):
        await store.transition("t1", settle(token + 1, expected=only_aborting))
    with pytest.raises(StaleTransitionError, match="is aborting, expected one of"):
        await store.transition("t1", settle(token))
    with pytest.raises(ValueError, match="No transition aborting → pending"):
        await store.transition("t1", settle(token, expected=only_aborting, new=TurnStatus.PENDING))

    assert begun == []
    assert await store.get_turn("t1") == aborting


async def test_a_round_saved_without_the_lease_names_why(store: SqlSessionStore) -> None:
    """A journal write for a missing turn, and one under a lease that moved on."""
    turn = await leased(store, "t1")
    begun = count_transactions(store)
    saved = RoundRecord(round=1, messages=[], committed=True)

    with pytest.raises(StaleTransitionError, match="does not exist"):
        await store.save_round("nobody", lease_token=1, round=saved)
    with pytest.raises(LeaseLostError, match=r"token 1, status pending"):
        await store.save_round("t1", lease_token=turn.lease_token - 1, round=saved)

    assert begun == []
    assert await store.load_rounds("t1") == []


async def test_an_unfenced_transition_moves_the_lease_token_on(store: SqlSessionStore) -> None:
    """A transition without a lease token (an operator's) still releases the lease: the
    token moves on, so the worker that held it can write nothing more."""
    turn = await leased(store, "t1")

    moved = await store.transition("t1", settle(None))

    assert moved.status is TurnStatus.COMPLETED
    assert moved.lease_token == turn.lease_token + 1
    with pytest.raises(LeaseLostError):
        await store.record_call(
            "t1",
            lease_token=turn.lease_token,
            call=ToolCallRecord(
                turn_id="t1",
                round=1,
                ref="r",
                name="n",
                status=ToolCallStatus.RUNNING,
                idempotency_key="k",
            ),
        )
