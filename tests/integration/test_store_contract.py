"""The SessionStore contract: every store implementation must pass this suite unchanged.

Each test runs once per entry of :data:`STORE_FACTORIES` (the ``store`` fixture is parametrised
over it). Today that is only ``InMemorySessionStore``, the reference implementation; the SQL
stores (``SqlSessionStore`` on SQLite and on PostgreSQL) join by adding one line each to
:data:`STORE_FACTORIES`: a name mapped to a zero-argument callable returning an async context
manager that yields a fresh, empty store (and tears its database down on exit).

:data:`KNOWN_FAILURES` lists (factory, test) pairs that currently violate the contract; they
run as strict ``xfail``, so fixing the store turns them red until the entry is removed.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest

from engine.errors import (
    ApprovalNotPendingError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    SessionBusyError,
    StaleSnapshotError,
    StaleTransitionError,
)
from engine.memory_store import InMemorySessionStore
from engine.parts import Message, Part
from engine.status import ALLOWED_TRANSITIONS, FinishReason, TurnStatus
from engine.store import (
    FollowOnClaim,
    InterruptAnswer,
    NewTurn,
    RoundRecord,
    SessionStore,
    ToolCallRecord,
    ToolCallStatus,
    Transition,
    TurnError,
    TurnInput,
    TurnRecord,
)
from tests.databases import events_of, sql_store

PENDING, ABORTING = TurnStatus.PENDING, TurnStatus.ABORTING
COMPLETED, FAILED, ABORTED = TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.ABORTED
SETTLED = (COMPLETED, FAILED, ABORTED)
FINISH = {COMPLETED: FinishReason.STOP, FAILED: FinishReason.FAILED, ABORTED: FinishReason.ABORTED}
AGENT = "banker"
LEASE = 30.0
SHORT_LEASE = 0.05
CLOCK_SLACK = timedelta(seconds=5)
FORBIDDEN_EDGES = [
    (old, new) for old in TurnStatus for new in TurnStatus if new not in ALLOWED_TRANSITIONS[old]
]


@asynccontextmanager
async def memory_store() -> AsyncIterator[SessionStore]:
    """A fresh in-memory store."""
    yield InMemorySessionStore()


StoreFactory = Callable[[], AbstractAsyncContextManager[SessionStore]]

#: Every store implementation under test; the SQL stores join here.
STORE_FACTORIES: dict[str, StoreFactory] = {
    "memory": memory_store,
    "sqlite": lambda: sql_store("sqlite"),
    "postgres": lambda: sql_store("postgres"),
}

#: (factory, test function) → why it currently fails; run as strict xfail.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


@pytest.fixture(params=sorted(STORE_FACTORIES))
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    """A fresh, empty store of each implementation."""
    reason = KNOWN_FAILURES.get((request.param, request.function.__name__))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    async with STORE_FACTORIES[request.param]() as opened:
        assert isinstance(opened, SessionStore)
        yield opened


# -- helpers ---------------------------------------------------------------------------


def new_turn(
    turn_id: str,
    session_id: str = "s1",
    *,
    kind: Literal["message", "resume", "retry", "restore"] = "message",
    messages: list[Message] | None = None,
    **fields: Any,
) -> NewTurn:
    """A NewTurn whose round 0 is ``messages`` (default: one user message for kind message)."""
    if messages is None:
        messages = [Message.user(f"message of {turn_id}")] if kind == "message" else []
    message = messages[0] if kind == "message" and messages else None
    return NewTurn(
        id=turn_id,
        session_id=session_id,
        agent=fields.pop("agent", AGENT),
        input=TurnInput(kind=kind, message=message),
        initial_messages=messages,
        **fields,
    )


def model_says(text: str) -> Message:
    """A model message holding one text part."""
    return Message(role="model", content=[Part.of_text(text)])


def asks(*refs: str) -> Message:
    """A model message requesting ``transferMoney`` once per ref."""
    return Message(
        role="model",
        content=[Part.of_request("transferMoney", ref, {"amount": 10}) for ref in refs],
    )


def tool_call(
    turn_id: str, round: int, ref: str, status: ToolCallStatus = ToolCallStatus.DONE, **fields: Any
) -> ToolCallRecord:
    """A journal row of a ``transferMoney`` call."""
    return ToolCallRecord(
        turn_id=turn_id,
        round=round,
        ref=ref,
        name="transferMoney",
        status=status,
        idempotency_key=f"{turn_id}:{round}:{ref}",
        **fields,
    )


def answer(
    turn_id: str, ref: str, value: Any = True, decided_by: str | None = None
) -> InterruptAnswer:
    """An InterruptAnswer responding to call ``ref`` of round 1 of ``turn_id``."""
    return InterruptAnswer(
        turn_id=turn_id, round=1, ref=ref, answer={"respond": value}, decided_by=decided_by
    )


def wire(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The messages as Genkit JSON (only the keys that were set)."""
    return [m.to_wire() for m in messages]


def wire_parts(parts: Sequence[Part]) -> list[dict[str, Any]]:
    """The parts as Genkit JSON."""
    return [p.to_wire() for p in parts]


def assert_recent(moment: datetime | None) -> None:
    """``moment`` is a timezone-aware timestamp close to now."""
    assert moment is not None
    assert moment.tzinfo is not None, "store timestamps must be timezone-aware"
    assert abs(datetime.now(UTC) - moment) < CLOCK_SLACK


async def claim(
    store: SessionStore, turn_id: str, owner: str = "w1", lease_seconds: float = LEASE
) -> TurnRecord:
    """Lease ``turn_id``."""
    return await store.claim_turn(turn_id, owner=owner, lease_seconds=lease_seconds)


async def settle(
    store: SessionStore, turn_id: str, status: TurnStatus = COMPLETED, token: int | None = None
) -> TurnRecord:
    """Settle ``turn_id`` (claiming it first unless its lease ``token`` is given)."""
    if token is None:
        token = (await claim(store, turn_id)).lease_token
    current = await store.get_turn(turn_id)
    assert current is not None
    return await store.transition(
        turn_id,
        Transition(
            expected={current.status}, new=status, lease_token=token, finish_reason=FINISH[status]
        ),
    )


async def turn_in(store: SessionStore, status: TurnStatus, turn_id: str = "t1") -> TurnRecord:
    """A claimed turn brought to ``status``; its lease token is ``record.lease_token``."""
    await store.create_turn(new_turn(turn_id))
    leased = await claim(store, turn_id)
    if status is ABORTING:
        assert await store.request_abort(turn_id) is ABORTING
    elif status is not PENDING:
        await settle(store, turn_id, status, leased.lease_token)
    current = await store.get_turn(turn_id)
    assert current is not None and current.status is status
    return current


async def paused_turn(
    store: SessionStore,
    turn_id: str,
    session_id: str = "s1",
    *,
    interrupted: Sequence[str] = ("r1",),
) -> TurnRecord:
    """A turn settled ``completed/interrupted`` at ``interrupted`` calls, plus one done call."""
    await store.create_turn(new_turn(turn_id, session_id))
    token = (await claim(store, turn_id)).lease_token
    calls = [tool_call(turn_id, 1, ref, ToolCallStatus.INTERRUPTED) for ref in interrupted]
    calls.append(tool_call(turn_id, 1, "done", output={"ok": True}))
    await store.save_round(
        turn_id,
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks(*interrupted, "done")], committed=True),
        calls=calls,
    )
    return await store.transition(
        turn_id,
        Transition(
            expected={PENDING},
            new=COMPLETED,
            lease_token=token,
            finish_reason=FinishReason.INTERRUPTED,
        ),
    )


async def latest_id(store: SessionStore, session_id: str = "s1") -> str | None:
    """The id of the session's latest turn."""
    latest = await store.latest_turn(session_id)
    return None if latest is None else latest.id


async def calls_by_ref(store: SessionStore, turn_id: str) -> dict[str, ToolCallRecord]:
    """The journal of ``turn_id`` keyed by ref."""
    return {c.ref: c for c in await store.list_calls(turn_id)}


# -- create_turn -----------------------------------------------------------------------


async def test_create_turn_inserts_pending_turn_session_round_zero_and_event(
    store: SessionStore,
) -> None:
    """create_turn inserts a pending turn, its session, its committed round 0 and one event."""
    hello = Message.user("hi")
    record = await store.create_turn(
        new_turn("t1", "s1", messages=[hello], owner="alice", max_attempts=3)
    )
    assert (record.id, record.session_id, record.agent, record.parent_id) == (
        "t1",
        "s1",
        AGENT,
        None,
    )
    assert record.status is PENDING
    assert (record.finish_reason, record.error, record.settled_at) == (None, None, None)
    assert (record.attempts, record.max_attempts, record.lease_token) == (0, 3, 0)
    assert (record.lease_owner, record.lease_expires_at) == (None, None)
    assert record.history_length == 0
    assert record.input.kind == "message"
    assert record.input.message is not None and record.input.message.to_wire() == hello.to_wire()
    for moment in (record.created_at, record.updated_at, record.run_after):
        assert_recent(moment)
    assert record.run_after <= datetime.now(UTC)
    assert await store.get_turn("t1") == record

    session = await store.get_session("s1")
    assert session is not None
    assert (session.id, session.agent, session.owner) == ("s1", AGENT, "alice")
    assert_recent(session.created_at)
    assert_recent(session.updated_at)

    rounds = await store.load_rounds("t1")
    assert [(r.round, r.committed, wire(r.messages)) for r in rounds] == [(0, True, wire([hello]))]
    assert wire(await store.load_conversation("t1")) == wire([hello])
    assert await store.list_calls("t1") == []

    events = await events_of(store, "t1")
    assert [(e.turn_id, e.from_status, e.to_status, e.attempt) for e in events] == [
        ("t1", None, PENDING, 0)
    ]
    assert_recent(events[0].at)


@pytest.mark.parametrize("holding", ["pending", "leased", "aborting"])
async def test_create_turn_in_busy_session_raises_and_writes_nothing(
    store: SessionStore, holding: str
) -> None:
    """A second turn in a session holding a pending or aborting turn is refused until it settles."""
    if holding == "pending":
        token = None
        await store.create_turn(new_turn("t1"))
    else:
        token = (await turn_in(store, ABORTING if holding == "aborting" else PENDING)).lease_token
    session_before = await store.get_session("s1")

    with pytest.raises(SessionBusyError):
        await store.create_turn(new_turn("t2", parent_id="t1", history_length=1))

    assert await store.get_turn("t2") is None
    assert await latest_id(store) == "t1"
    assert await store.get_session("s1") == session_before

    await settle(store, "t1", ABORTED, token)
    created = await store.create_turn(new_turn("t2", parent_id="t1", history_length=1))
    assert created.status is PENDING
    assert await latest_id(store) == "t2"


async def test_busy_session_leaves_answered_interrupts_pending(store: SessionStore) -> None:
    """A create_turn refused because the session is busy applies none of its answers."""
    await paused_turn(store, "p1")
    await store.create_turn(new_turn("t2", parent_id="p1", history_length=1))

    with pytest.raises(SessionBusyError):
        await store.create_turn(new_turn("t3", parent_id="p1"), answers=[answer("p1", "r1")])

    row = (await calls_by_ref(store, "p1"))["r1"]
    assert (row.status, row.answer, row.decided_at) == (ToolCallStatus.INTERRUPTED, None, None)
    assert await store.get_turn("t3") is None


async def test_create_turn_rejects_session_of_another_agent(store: SessionStore) -> None:
    """create_turn in a session that belongs to another agent raises InvalidArgumentError."""
    await store.create_turn(new_turn("t1"))
    await settle(store, "t1")
    session_before = await store.get_session("s1")

    with pytest.raises(InvalidArgumentError):
        await store.create_turn(new_turn("t2", agent="intruder", parent_id="t1"))

    assert await store.get_turn("t2") is None
    assert await store.get_session("s1") == session_before
    assert await latest_id(store) == "t1"


@pytest.mark.parametrize("session_id", ["s1", "s2"])
async def test_create_turn_rejects_duplicate_turn_id(store: SessionStore, session_id: str) -> None:
    """A turn id that already exists is refused (InvalidArgumentError), in any session."""
    await store.create_turn(new_turn("t1", messages=[Message.user("original")]))
    original = await settle(store, "t1")

    with pytest.raises(InvalidArgumentError):
        await store.create_turn(new_turn("t1", session_id, messages=[Message.user("copy")]))

    assert await store.get_turn("t1") == original
    assert wire(await store.load_conversation("t1")) == wire([Message.user("original")])
    if session_id == "s2":
        assert await store.get_session("s2") is None


# -- answers -----------------------------------------------------------------------------


async def test_create_turn_marks_answered_interrupts(store: SessionStore) -> None:
    """create_turn(answers=...) marks each interrupted row answered with its decision."""
    await paused_turn(store, "p1", interrupted=("r1", "r2"))
    restart = InterruptAnswer(
        turn_id="p1", round=1, ref="r2", answer={"restart": {"approved": True}}
    )

    await store.create_turn(
        new_turn("t2", kind="resume", parent_id="p1"),
        answers=[answer("p1", "r1", {"approved": False}, decided_by="bob"), restart],
    )

    rows = await calls_by_ref(store, "p1")
    assert rows["r1"].status is ToolCallStatus.ANSWERED
    assert rows["r1"].answer == {"respond": {"approved": False}}
    assert rows["r1"].decided_by == "bob"
    assert_recent(rows["r1"].decided_at)
    assert rows["r2"].status is ToolCallStatus.ANSWERED
    assert rows["r2"].answer == {"restart": {"approved": True}}
    assert rows["r2"].decided_by is None
    assert_recent(rows["r2"].decided_at)
    assert rows["done"].status is ToolCallStatus.DONE
    assert rows["done"].answer is None


@pytest.mark.parametrize("bad_ref", ["answered", "unknown", "done"])
async def test_create_turn_with_stale_answer_writes_nothing(
    store: SessionStore, bad_ref: str
) -> None:
    """One answer to a row that is not interrupted fails the whole create_turn, writing nothing."""
    await paused_turn(store, "p1", interrupted=("r1", "answered"))
    await store.create_turn(
        new_turn("t2", kind="resume", parent_id="p1"), answers=[answer("p1", "answered")]
    )
    await settle(store, "t2")
    session_before = await store.get_session("s1")
    rows_before = await calls_by_ref(store, "p1")

    with pytest.raises(ApprovalNotPendingError):
        await store.create_turn(
            new_turn("t3", kind="resume", parent_id="p1"),
            answers=[answer("p1", "r1"), answer("p1", bad_ref, "late")],
        )

    assert await calls_by_ref(store, "p1") == rows_before
    assert rows_before["r1"].status is ToolCallStatus.INTERRUPTED
    assert await store.get_turn("t3") is None
    assert await store.get_session("s1") == session_before
    assert await latest_id(store) == "t2"


async def test_concurrent_resumes_of_one_snapshot_create_one_turn(store: SessionStore) -> None:
    """Ten resumes of one paused snapshot at once: one turn is created with its answers, every
    other attempt gets a typed conflict and writes nothing (no second turn, no answer of its)."""
    await paused_turn(store, "p1", interrupted=("r1", "r2"))

    async def resume(number: int) -> str:
        await store.create_turn(
            new_turn(f"t{number}", kind="resume", parent_id="p1"),
            answers=[answer("p1", "r1", number, f"u{number}"), answer("p1", "r2", number)],
        )
        return f"t{number}"

    outcomes = await asyncio.gather(*(resume(n) for n in range(10)), return_exceptions=True)

    winners = [o for o in outcomes if isinstance(o, str)]
    assert len(winners) == 1, outcomes
    assert all(
        isinstance(o, ApprovalNotPendingError | SessionBusyError)
        for o in outcomes
        if o not in winners
    ), outcomes
    number = int(winners[0][1:])
    rows = await calls_by_ref(store, "p1")
    assert {ref: (rows[ref].status, rows[ref].answer) for ref in ("r1", "r2")} == {
        "r1": (ToolCallStatus.ANSWERED, {"respond": number}),
        "r2": (ToolCallStatus.ANSWERED, {"respond": number}),
    }
    assert rows["r1"].decided_by == f"u{number}"
    assert [await store.get_turn(f"t{n}") is not None for n in range(10)].count(True) == 1
    assert await latest_id(store) == winners[0]


async def test_stale_answer_in_new_session_creates_no_session(store: SessionStore) -> None:
    """A create_turn refused for a foreign answer does not create its new session either."""
    with pytest.raises(InvalidArgumentError):
        await store.create_turn(new_turn("t1", "fresh"), answers=[answer("nowhere", "r1")])

    assert await store.get_session("fresh") is None
    assert await store.get_turn("t1") is None
    assert await store.latest_turn("fresh") is None


async def test_interrupt_can_be_answered_only_once(store: SessionStore) -> None:
    """A second turn answering an interrupt already answered gets ApprovalNotPendingError."""
    await paused_turn(store, "p1")
    await store.create_turn(
        new_turn("t2", kind="resume", parent_id="p1"), answers=[answer("p1", "r1", "first", "ann")]
    )
    await settle(store, "t2")

    with pytest.raises(ApprovalNotPendingError):
        await store.create_turn(
            new_turn("t3", kind="resume", parent_id="p1"),
            answers=[answer("p1", "r1", "second", "bob")],
        )

    row = (await calls_by_ref(store, "p1"))["r1"]
    assert (row.answer, row.decided_by) == ({"respond": "first"}, "ann")
    assert await store.get_turn("t3") is None


# -- reads -------------------------------------------------------------------------------


async def test_reads_of_unknown_ids_return_none(store: SessionStore) -> None:
    """get_turn, get_session and latest_turn return None for ids the store never saw."""
    await store.create_turn(new_turn("t1"))

    assert await store.get_turn("nope") is None
    assert await store.get_session("nope") is None
    assert await store.latest_turn("nope") is None


async def test_latest_turn_is_newest_created(store: SessionStore) -> None:
    """latest_turn returns the session's newest turn."""
    await store.create_turn(new_turn("root"))
    assert await latest_id(store) == "root"
    await settle(store, "root")
    await store.create_turn(new_turn("child", parent_id="root", history_length=1))
    await settle(store, "child")

    latest = await store.latest_turn("s1")
    assert latest is not None and latest.id == "child"
    assert latest.parent_id == "root"


async def test_a_turn_continuing_an_older_snapshot_is_refused(store: SessionStore) -> None:
    """A new turn whose parent is no longer the session's latest gets StaleSnapshotError
    naming the latest, and nothing is written (no branch that would drop a message)."""
    await store.create_turn(new_turn("root"))
    await settle(store, "root")
    await store.create_turn(new_turn("child", parent_id="root", history_length=1))
    await settle(store, "child")
    session_before = await store.get_session("s1")

    with pytest.raises(StaleSnapshotError) as refused:
        await store.create_turn(new_turn("branch", parent_id="root", history_length=1))

    assert refused.value.snapshot_id == "child"
    assert refused.value.status == "ABORTED"
    assert await store.get_turn("branch") is None
    assert await latest_id(store) == "child"
    assert await store.get_session("s1") == session_before


async def test_a_first_turn_in_a_session_with_turns_is_refused(store: SessionStore) -> None:
    """A turn with no parent cannot join a session that already has turns: it would start
    the conversation over and hide the earlier messages."""
    await store.create_turn(new_turn("root"))
    await settle(store, "root")

    with pytest.raises(StaleSnapshotError):
        await store.create_turn(new_turn("again"))

    assert await store.get_turn("again") is None
    assert await latest_id(store) == "root"


# -- claiming ----------------------------------------------------------------------------


async def test_claim_turn_leases_pending_turn(store: SessionStore) -> None:
    """claim_turn sets the lease owner and expiry and increments lease_token and attempts."""
    await store.create_turn(new_turn("t1"))

    leased = await claim(store, "t1", owner="w1", lease_seconds=LEASE)

    assert leased.status is PENDING
    assert (leased.lease_owner, leased.lease_token, leased.attempts) == ("w1", 1, 1)
    assert leased.lease_expires_at is not None
    assert leased.lease_expires_at > datetime.now(UTC) + timedelta(seconds=LEASE / 2)
    assert_recent(leased.lease_expires_at - timedelta(seconds=LEASE))
    assert await store.get_turn("t1") == leased


async def test_claim_turn_refuses_live_lease(store: SessionStore) -> None:
    """Claiming a turn whose lease is live raises StaleTransitionError and changes nothing."""
    await store.create_turn(new_turn("t1"))
    leased = await claim(store, "t1", owner="w1")

    with pytest.raises(StaleTransitionError):
        await claim(store, "t1", owner="w2")

    assert await store.get_turn("t1") == leased


async def test_expired_lease_can_be_claimed_by_another_owner(store: SessionStore) -> None:
    """Once a lease expires another owner can claim the turn and gets a higher token."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1", owner="w1", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE * 3)

    second = await claim(store, "t1", owner="w2")

    assert second.lease_owner == "w2"
    assert second.lease_token > first.lease_token
    assert second.attempts == first.attempts + 1
    assert second.lease_expires_at is not None and second.lease_expires_at > datetime.now(UTC)


@pytest.mark.parametrize("status", SETTLED)
async def test_settled_turn_cannot_be_claimed(store: SessionStore, status: TurnStatus) -> None:
    """claim_turn on a settled (or unknown) turn raises StaleTransitionError."""
    settled = await turn_in(store, status)

    with pytest.raises(StaleTransitionError):
        await claim(store, "t1", owner="w2")
    with pytest.raises(StaleTransitionError):
        await claim(store, "nope", owner="w2")

    assert await store.get_turn("t1") == settled


async def test_claim_next_takes_oldest_run_after_first_up_to_limit(store: SessionStore) -> None:
    """claim_next leases claimable turns oldest run_after first, at most limit of them."""
    for n in (1, 2, 3):
        await store.create_turn(new_turn(f"t{n}", f"s{n}"))
    token = (await claim(store, "t1")).lease_token
    await asyncio.sleep(0.01)
    await store.transition(
        "t1",
        Transition(expected={PENDING}, new=PENDING, lease_token=token, run_after=datetime.now(UTC)),
    )

    first = await store.claim_next(owner="w2", lease_seconds=LEASE, limit=2)

    assert [t.id for t in first] == ["t2", "t3"]
    for turn in first:
        assert (turn.lease_owner, turn.lease_token, turn.attempts) == ("w2", 1, 1)
        assert turn.lease_expires_at is not None and turn.lease_expires_at > datetime.now(UTC)
        assert await store.get_turn(turn.id) == turn
    rest = await store.claim_next(owner="w3", lease_seconds=LEASE, limit=5)
    # Token 1 (first claim) → 2 (the hand-back fences the old worker out) → 3 (this claim).
    assert [(t.id, t.lease_owner, t.lease_token) for t in rest] == [("t1", "w3", 3)]
    assert await store.claim_next(owner="w4", lease_seconds=LEASE, limit=5) == []


async def test_claim_next_filters_by_agent(store: SessionStore) -> None:
    """claim_next with agents leases only turns of those agents."""
    await store.create_turn(new_turn("a1", "s1", agent="alpha"))
    await store.create_turn(new_turn("b1", "s2", agent="beta"))

    assert await store.claim_next(owner="w", lease_seconds=LEASE, limit=5, agents={"gamma"}) == []
    claimed = await store.claim_next(owner="w", lease_seconds=LEASE, limit=5, agents=["beta"])

    assert [t.id for t in claimed] == ["b1"]
    untouched = await store.get_turn("a1")
    assert untouched is not None and (untouched.lease_owner, untouched.attempts) == (None, 0)


async def test_a_settle_claims_the_next_turn_for_the_slot_it_frees(store: SessionStore) -> None:
    """transition(then_claim=) settles the turn, then leases the oldest claimable turn of the
    claim's agents to its owner and reports it; a claim that finds nothing says it ran."""
    await store.create_turn(new_turn("b1", "s2", agent="beta"))
    await store.create_turn(new_turn("a2", "s3"))
    token = (await turn_in(store, PENDING)).lease_token
    follow = FollowOnClaim(owner="w1", lease_seconds=LEASE, agents=[AGENT])

    settled = await store.transition(
        "t1",
        Transition(
            expected={PENDING},
            new=COMPLETED,
            lease_token=token,
            finish_reason=FinishReason.STOP,
            then_claim=follow,
        ),
    )

    assert settled.status is COMPLETED
    assert follow.ran and [(t.id, t.lease_owner, t.attempts) for t in follow.claimed] == [
        ("a2", "w1", 1)
    ]
    assert await store.get_turn("a2") == follow.claimed[0]
    untouched = await store.get_turn("b1")
    assert untouched is not None and untouched.lease_owner is None
    empty = FollowOnClaim(owner="w1", lease_seconds=LEASE, agents=[AGENT])
    await store.transition(
        "a2",
        Transition(
            expected={PENDING},
            new=COMPLETED,
            lease_token=follow.claimed[0].lease_token,
            finish_reason=FinishReason.STOP,
            then_claim=empty,
        ),
    )
    assert empty.ran and empty.claimed == []


async def test_a_refused_settle_leases_nothing_it_does_not_report(store: SessionStore) -> None:
    """A settle refused for a stale lease raises as always; whatever its follow-on claim
    leased (a store may run the claim with it) is reported, so its owner can run it."""
    await store.create_turn(new_turn("t2", "s2"))
    leased = await turn_in(store, PENDING)
    follow = FollowOnClaim(owner="w9", lease_seconds=LEASE)

    with pytest.raises(StaleTransitionError):
        await store.transition(
            "t1",
            Transition(
                expected={PENDING},
                new=COMPLETED,
                lease_token=leased.lease_token + 1,
                finish_reason=FinishReason.STOP,
                then_claim=follow,
            ),
        )

    still = await store.get_turn("t1")
    assert still is not None and still.status is PENDING
    other = await store.get_turn("t2")
    assert other is not None
    reported = [t.id for t in follow.claimed]
    assert (other.lease_owner == "w9") == ("t2" in reported)
    assert not follow.claimed or follow.ran


async def test_claim_next_among_leases_only_the_named_claimable_turns(
    store: SessionStore,
) -> None:
    """claim_next(among=ids) leases only claimable turns named in ids (unknown and leased
    ids are passed over), oldest first; an empty among leases nothing."""
    for n in (1, 2, 3, 4):
        await store.create_turn(new_turn(f"t{n}", f"s{n}"))
    await claim(store, "t2")

    assert await store.claim_next(owner="w2", lease_seconds=LEASE, limit=5, among=[]) == []
    claimed = await store.claim_next(
        owner="w2", lease_seconds=LEASE, limit=5, among=["t4", "nope", "t2", "t3"]
    )

    assert [(t.id, t.lease_owner) for t in claimed] == [("t3", "w2"), ("t4", "w2")]
    untouched = await store.get_turn("t1")
    assert untouched is not None and untouched.lease_owner is None
    assert [t.id for t in await store.claim_next(owner="w3", lease_seconds=LEASE)] == ["t1"]


async def test_claim_next_skips_leased_future_and_settled_turns(store: SessionStore) -> None:
    """claim_next never returns a leased turn, a turn whose run_after is ahead, or a settled one."""
    for n in (1, 2, 3, 4):
        await store.create_turn(new_turn(f"t{n}", f"s{n}"))
    leased = await claim(store, "t1")
    token = (await claim(store, "t2")).lease_token
    later = datetime.now(UTC) + timedelta(hours=1)
    await store.transition(
        "t2", Transition(expected={PENDING}, new=PENDING, lease_token=token, run_after=later)
    )
    await settle(store, "t3")
    before = {n: await store.get_turn(f"t{n}") for n in (1, 2, 3)}

    claimed = await store.claim_next(owner="w2", lease_seconds=LEASE, limit=10)

    assert [t.id for t in claimed] == ["t4"]
    assert {n: await store.get_turn(f"t{n}") for n in (1, 2, 3)} == before
    assert before[1] == leased


async def test_concurrent_claim_next_never_share_a_turn(store: SessionStore) -> None:
    """Two concurrent claim_next calls lease disjoint turns, and nothing is leased twice."""
    ids = {f"t{n}" for n in range(6)}
    for turn_id in sorted(ids):
        await store.create_turn(new_turn(turn_id, f"s-{turn_id}"))

    first, second = await asyncio.gather(
        store.claim_next(owner="w1", lease_seconds=LEASE, limit=4),
        store.claim_next(owner="w2", lease_seconds=LEASE, limit=4),
    )

    first_ids, second_ids = {t.id for t in first}, {t.id for t in second}
    assert not first_ids & second_ids
    assert first_ids | second_ids == ids
    assert len(first) + len(second) == len(ids)
    assert await store.claim_next(owner="w3", lease_seconds=LEASE, limit=10) == []


# -- leases ------------------------------------------------------------------------------


async def test_renew_lease_extends_lease(store: SessionStore) -> None:
    """renew_lease pushes lease_expires_at forward and keeps token, owner and attempts."""
    await store.create_turn(new_turn("t1"))
    leased = await claim(store, "t1", lease_seconds=1)

    renewed = await store.renew_lease("t1", lease_token=leased.lease_token, lease_seconds=LEASE)

    assert renewed.lease_expires_at is not None and leased.lease_expires_at is not None
    assert renewed.lease_expires_at > leased.lease_expires_at + timedelta(seconds=LEASE / 2)
    assert (renewed.lease_token, renewed.lease_owner, renewed.attempts) == (1, "w1", 1)
    assert renewed.status is PENDING
    assert await store.get_turn("t1") == renewed


async def test_renew_lease_with_stale_token_raises(store: SessionStore) -> None:
    """renew_lease with a token that is no longer the turn's raises LeaseLostError."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1", owner="w1", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE * 3)
    second = await claim(store, "t1", owner="w2")

    with pytest.raises(LeaseLostError):
        await store.renew_lease("t1", lease_token=first.lease_token, lease_seconds=LEASE)
    with pytest.raises(LeaseLostError):
        await store.renew_lease("t1", lease_token=second.lease_token + 1, lease_seconds=LEASE)

    assert await store.get_turn("t1") == second


@pytest.mark.parametrize("status", SETTLED)
async def test_renew_lease_after_settle_raises(store: SessionStore, status: TurnStatus) -> None:
    """renew_lease on a settled turn raises LeaseLostError, even with the last token."""
    settled = await turn_in(store, status)

    with pytest.raises(LeaseLostError):
        await store.renew_lease("t1", lease_token=settled.lease_token, lease_seconds=LEASE)

    assert await store.get_turn("t1") == settled


async def test_renew_lease_reports_aborting(store: SessionStore) -> None:
    """renew_lease returns the current status, so a heartbeat sees an abort request."""
    await store.create_turn(new_turn("t1"))
    leased = await claim(store, "t1")
    assert await store.request_abort("t1") is ABORTING

    renewed = await store.renew_lease("t1", lease_token=leased.lease_token, lease_seconds=LEASE)

    assert renewed.status is ABORTING
    assert (renewed.lease_owner, renewed.lease_token) == ("w1", leased.lease_token)


# -- transitions -------------------------------------------------------------------------


async def test_transition_with_unexpected_status_raises_and_changes_nothing(
    store: SessionStore,
) -> None:
    """transition from a status not in expected raises StaleTransitionError and changes nothing."""
    leased = await turn_in(store, PENDING)
    events = await events_of(store, "t1")

    with pytest.raises(StaleTransitionError):
        await store.transition(
            "t1", Transition(expected={ABORTING}, new=ABORTED, lease_token=leased.lease_token)
        )

    assert await store.get_turn("t1") == leased
    assert await events_of(store, "t1") == events


async def test_transition_with_stale_lease_token_raises_lease_lost(store: SessionStore) -> None:
    """transition with a lease token that is not the turn's raises LeaseLostError."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1", owner="w1", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE * 3)
    second = await claim(store, "t1", owner="w2")
    events = await events_of(store, "t1")

    with pytest.raises(LeaseLostError):
        await store.transition(
            "t1", Transition(expected={PENDING}, new=COMPLETED, lease_token=first.lease_token)
        )

    assert await store.get_turn("t1") == second
    assert await events_of(store, "t1") == events


@pytest.mark.parametrize(
    ("old", "new"), FORBIDDEN_EDGES, ids=[f"{o.value}->{n.value}" for o, n in FORBIDDEN_EDGES]
)
async def test_transition_refuses_edges_outside_state_machine(
    store: SessionStore, old: TurnStatus, new: TurnStatus
) -> None:
    """transition along an edge missing from ALLOWED_TRANSITIONS raises ValueError, no change."""
    before = await turn_in(store, old)
    events = await events_of(store, "t1")

    with pytest.raises(ValueError):
        await store.transition("t1", Transition(expected={old}, new=new, lease_token=None))

    assert await store.get_turn("t1") == before
    assert await events_of(store, "t1") == events


@pytest.mark.parametrize("status", SETTLED)
async def test_settling_releases_lease_and_records_outcome(
    store: SessionStore, status: TurnStatus
) -> None:
    """Settling releases the lease and sets status, settled_at, finish_reason and error."""
    leased = await turn_in(store, PENDING)
    error = TurnError(status="INTERNAL", message="boom", details={"trace": ["a", "b"]})

    settled = await store.transition(
        "t1",
        Transition(
            expected={PENDING},
            new=status,
            lease_token=leased.lease_token,
            finish_reason=FINISH[status],
            error=error,
        ),
    )

    assert settled.status is status
    assert (settled.finish_reason, settled.error) == (FINISH[status], error)
    assert (settled.lease_owner, settled.lease_expires_at) == (None, None)
    assert_recent(settled.settled_at)
    assert settled.updated_at >= leased.updated_at
    assert await store.get_turn("t1") == settled


@pytest.mark.parametrize("status", SETTLED)
async def test_runner_settles_aborting_turn_by_outcome(
    store: SessionStore, status: TurnStatus
) -> None:
    """The lease holder may settle an aborting turn aborted, completed or failed."""
    leased = await turn_in(store, ABORTING)

    settled = await store.transition(
        "t1",
        Transition(
            expected={ABORTING},
            new=status,
            lease_token=leased.lease_token,
            finish_reason=FINISH[status],
        ),
    )

    assert (settled.status, settled.finish_reason) == (status, FINISH[status])
    assert (settled.lease_owner, settled.lease_expires_at) == (None, None)
    assert_recent(settled.settled_at)


async def test_hand_back_sets_run_after_and_releases_lease(store: SessionStore) -> None:
    """pending→pending hands the turn back: lease released, run_after set, not settled."""
    leased = await turn_in(store, PENDING)
    later = datetime.now(UTC) + timedelta(minutes=5)
    error = TurnError(status="UNAVAILABLE", message="model timed out")

    handed = await store.transition(
        "t1",
        Transition(
            expected={PENDING},
            new=PENDING,
            lease_token=leased.lease_token,
            run_after=later,
            error=error,
        ),
    )

    assert handed.status is PENDING
    assert (handed.lease_owner, handed.lease_expires_at, handed.settled_at) == (None, None, None)
    assert abs(handed.run_after - later) < timedelta(milliseconds=1)
    assert handed.error == error
    assert handed.attempts == 1
    assert await store.get_turn("t1") == handed


async def test_transitions_are_recorded_as_events_in_order(store: SessionStore) -> None:
    """Every transition appends a TurnEvent (from, to, attempt, note), oldest first."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1")
    await store.transition(
        "t1",
        Transition(expected={PENDING}, new=PENDING, lease_token=first.lease_token, note="retry"),
    )
    second = await claim(store, "t1")
    assert await store.request_abort("t1") is ABORTING
    await store.transition(
        "t1",
        Transition(
            expected={ABORTING},
            new=ABORTED,
            lease_token=second.lease_token,
            finish_reason=FinishReason.ABORTED,
            note="stopped",
        ),
    )

    events = await events_of(store, "t1")

    assert [(e.turn_id, e.from_status, e.to_status, e.attempt) for e in events] == [
        ("t1", None, PENDING, 0),
        ("t1", PENDING, PENDING, 1),
        ("t1", PENDING, ABORTING, 2),
        ("t1", ABORTING, ABORTED, 2),
    ]
    assert (events[1].note, events[3].note) == ("retry", "stopped")
    for earlier, later in itertools.pairwise(events):
        assert earlier.at <= later.at
    assert_recent(events[-1].at)


# -- abort ---------------------------------------------------------------------------------


async def test_request_abort_of_leased_pending_turn_is_aborting(store: SessionStore) -> None:
    """request_abort on a leased pending turn moves it to aborting and keeps the lease."""
    leased = await turn_in(store, PENDING)

    assert await store.request_abort("t1") is ABORTING

    current = await store.get_turn("t1")
    assert current is not None and current.status is ABORTING
    assert (current.lease_owner, current.lease_token) == ("w1", leased.lease_token)
    assert (current.settled_at, current.finish_reason) == (None, None)


@pytest.mark.parametrize("how", ["never-claimed", "handed-back", "lease-expired"])
async def test_request_abort_of_unleased_pending_turn_is_aborted(
    store: SessionStore, how: str
) -> None:
    """request_abort on a pending turn nobody holds settles it aborted at once."""
    await store.create_turn(new_turn("t1"))
    if how == "handed-back":
        token = (await claim(store, "t1")).lease_token
        later = datetime.now(UTC) + timedelta(hours=1)
        await store.transition(
            "t1", Transition(expected={PENDING}, new=PENDING, lease_token=token, run_after=later)
        )
    elif how == "lease-expired":
        await claim(store, "t1", lease_seconds=SHORT_LEASE)
        await asyncio.sleep(SHORT_LEASE * 3)

    assert await store.request_abort("t1") is ABORTED

    current = await store.get_turn("t1")
    assert current is not None
    assert (current.status, current.finish_reason) == (ABORTED, FinishReason.ABORTED)
    assert_recent(current.settled_at)
    assert (await events_of(store, "t1"))[-1].to_status is ABORTED
    created = await store.create_turn(new_turn("t2", parent_id="t1", history_length=1))
    assert created.status is PENDING


@pytest.mark.parametrize("status", [ABORTING, *SETTLED])
async def test_request_abort_leaves_aborting_and_settled_turns_alone(
    store: SessionStore, status: TurnStatus
) -> None:
    """request_abort on an aborting or settled turn returns its status and changes nothing."""
    before = await turn_in(store, status)
    events = await events_of(store, "t1")

    assert await store.request_abort("t1") is status

    assert await store.get_turn("t1") == before
    assert await events_of(store, "t1") == events


async def test_request_abort_of_unknown_turn_raises_not_found(store: SessionStore) -> None:
    """request_abort on an unknown turn raises NotFoundError."""
    with pytest.raises(NotFoundError):
        await store.request_abort("nope")


# -- rounds and journal --------------------------------------------------------------------


@pytest.mark.parametrize("lost", ["stale-token", "settled"])
async def test_save_round_is_fenced(store: SessionStore, lost: str) -> None:
    """save_round with a stale lease token or on a settled turn raises LeaseLostError, no write."""
    await store.create_turn(new_turn("t1"))
    token = (await claim(store, "t1", lease_seconds=SHORT_LEASE)).lease_token
    await store.save_round(
        "t1", lease_token=token, round=RoundRecord(round=1, messages=[asks("r1")], committed=False)
    )
    if lost == "stale-token":
        await asyncio.sleep(SHORT_LEASE * 3)
        await claim(store, "t1", owner="w2")
    else:
        await settle(store, "t1", FAILED, token)
    rounds, calls = await store.load_rounds("t1"), await store.list_calls("t1")

    with pytest.raises(LeaseLostError):
        await store.save_round(
            "t1",
            lease_token=token,
            round=RoundRecord(round=1, messages=[model_says("late")], committed=True),
            calls=[tool_call("t1", 1, "r1")],
        )
    with pytest.raises(LeaseLostError):
        await store.save_round(
            "t1",
            lease_token=token,
            round=RoundRecord(round=2, messages=[model_says("late")], committed=True),
        )

    assert await store.load_rounds("t1") == rounds
    assert await store.list_calls("t1") == calls == []
    assert [r.round for r in rounds] == [0, 1]


@pytest.mark.parametrize("lost", ["stale-token", "settled"])
async def test_record_call_is_fenced(store: SessionStore, lost: str) -> None:
    """record_call with a stale lease token or on a settled turn raises LeaseLostError, no write."""
    await store.create_turn(new_turn("t1"))
    token = (await claim(store, "t1", lease_seconds=SHORT_LEASE)).lease_token
    await store.record_call(
        "t1", lease_token=token, call=tool_call("t1", 1, "r1", ToolCallStatus.RUNNING)
    )
    if lost == "stale-token":
        await asyncio.sleep(SHORT_LEASE * 3)
        await claim(store, "t1", owner="w2")
    else:
        await settle(store, "t1", COMPLETED, token)
    calls = await store.list_calls("t1")

    with pytest.raises(LeaseLostError):
        await store.record_call("t1", lease_token=token, call=tool_call("t1", 1, "r1"))
    with pytest.raises(LeaseLostError):
        await store.record_call("t1", lease_token=token, call=tool_call("t1", 1, "r2"))

    assert await store.list_calls("t1") == calls
    assert [(c.ref, c.status) for c in calls] == [("r1", ToolCallStatus.RUNNING)]


async def test_runner_may_write_while_aborting(store: SessionStore) -> None:
    """The lease holder of an aborting turn can still save rounds and journal calls."""
    leased = await turn_in(store, ABORTING)
    token = leased.lease_token

    await store.save_round(
        "t1", lease_token=token, round=RoundRecord(round=1, messages=[asks("r1")], committed=True)
    )
    await store.record_call("t1", lease_token=token, call=tool_call("t1", 1, "r1"))

    assert [r.round for r in await store.load_rounds("t1")] == [0, 1]
    assert [c.ref for c in await store.list_calls("t1")] == ["r1"]


async def test_save_round_upserts_round_and_calls(store: SessionStore) -> None:
    """save_round replaces the messages of the same round and upserts calls by (round, ref)."""
    leased = await turn_in(store, PENDING)
    token = leased.lease_token
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks("r1", "r2")], committed=False),
        calls=[
            tool_call("t1", 1, "r1", ToolCallStatus.REQUESTED),
            tool_call("t1", 1, "r2", ToolCallStatus.REQUESTED),
        ],
    )
    tool_message = Message(
        role="tool", content=[Part.of_response("transferMoney", "r1", {"ok": True})]
    )

    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks("r1"), tool_message], committed=True),
        calls=[tool_call("t1", 1, "r1", output={"ok": True})],
    )

    rounds = await store.load_rounds("t1")
    assert [(r.round, r.committed) for r in rounds] == [(0, True), (1, True)]
    assert wire(rounds[1].messages) == wire([asks("r1"), tool_message])
    rows = await store.list_calls("t1")
    assert [(c.round, c.ref, c.status, c.output) for c in rows] == [
        (1, "r1", ToolCallStatus.DONE, {"ok": True}),
        (1, "r2", ToolCallStatus.REQUESTED, None),
    ]


async def test_transition_saves_the_last_round_and_calls_with_the_settle(
    store: SessionStore,
) -> None:
    """transition(round=, calls=) writes the round and the journal rows as save_round does,
    in the transaction that settles the turn."""
    token = (await turn_in(store, PENDING)).lease_token
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks("r1")], committed=False),
        calls=[tool_call("t1", 1, "r1", ToolCallStatus.RUNNING)],
    )
    paused = tool_call("t1", 1, "r1", ToolCallStatus.INTERRUPTED, interrupt={"why": "ok?"})

    settled = await store.transition(
        "t1",
        Transition(
            expected={PENDING},
            new=COMPLETED,
            lease_token=token,
            finish_reason=FinishReason.INTERRUPTED,
            round=RoundRecord(round=1, messages=[asks("r1")], committed=True),
            calls=[paused],
        ),
    )

    assert (settled.status, settled.finish_reason) == (COMPLETED, FinishReason.INTERRUPTED)
    rounds = await store.load_rounds("t1")
    assert [(r.round, r.committed) for r in rounds] == [(0, True), (1, True)]
    assert wire(await store.load_conversation("t1"))[-1] == asks("r1").to_wire()
    (row,) = await store.list_calls("t1")
    assert row.model_copy(update={"created_at": None}) == paused


async def test_a_round_saved_again_with_fewer_messages_keeps_only_the_new_ones(
    store: SessionStore,
) -> None:
    """Saving a round again replaces all its messages: a shorter rewrite leaves none of the
    earlier ones behind, by save_round or by the settling transition."""
    token = (await turn_in(store, PENDING)).lease_token
    for number in (1, 2):
        await store.save_round(
            "t1",
            lease_token=token,
            round=RoundRecord(
                round=number,
                messages=[asks("a"), model_says("b"), model_says("c")],
                committed=False,
            ),
        )
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[model_says("one")], committed=True),
    )
    await store.transition(
        "t1",
        Transition(
            expected={PENDING},
            new=COMPLETED,
            lease_token=token,
            finish_reason=FinishReason.STOP,
            round=RoundRecord(round=2, messages=[model_says("two")], committed=True),
        ),
    )

    rounds = await store.load_rounds("t1")
    assert [(r.round, wire(r.messages), r.committed) for r in rounds[1:]] == [
        (1, wire([model_says("one")]), True),
        (2, wire([model_says("two")]), True),
    ]


async def test_save_round_writes_an_earlier_round_with_it(store: SessionStore) -> None:
    """save_round(earlier=) replaces two rounds in one write — each trimmed to its new
    messages — and upserts the journal rows of both."""
    token = (await turn_in(store, PENDING)).lease_token
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks("a"), model_says("b")], committed=False),
    )
    answered = tool_call("t1", 1, "a", output={"ok": True})
    opened = tool_call("t1", 2, "r2", ToolCallStatus.RUNNING)

    await store.save_round(
        "t1",
        lease_token=token,
        earlier=RoundRecord(round=1, messages=[model_says("one")], committed=True),
        round=RoundRecord(round=2, messages=[asks("r2")], committed=False),
        calls=[answered, opened],
    )

    rounds = await store.load_rounds("t1")
    assert [(r.round, wire(r.messages), r.committed) for r in rounds[1:]] == [
        (1, wire([model_says("one")]), True),
        (2, wire([asks("r2")]), False),
    ]
    assert [(c.round, c.ref, c.status) for c in await store.list_calls("t1")] == [
        (1, "a", ToolCallStatus.DONE),
        (2, "r2", ToolCallStatus.RUNNING),
    ]


async def test_refused_transition_saves_no_round(store: SessionStore) -> None:
    """A transition refused for a stale lease writes neither its round nor its calls."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1", owner="w1", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE * 3)
    await claim(store, "t1", owner="w2")

    with pytest.raises(LeaseLostError):
        await store.transition(
            "t1",
            Transition(
                expected={PENDING},
                new=COMPLETED,
                lease_token=first.lease_token,
                finish_reason=FinishReason.STOP,
                round=RoundRecord(round=1, messages=[model_says("late")], committed=True),
                calls=[tool_call("t1", 1, "r1")],
            ),
        )

    assert [r.round for r in await store.load_rounds("t1")] == [0]
    assert await store.list_calls("t1") == []


async def test_record_call_upserts_one_row(store: SessionStore) -> None:
    """record_call inserts a journal row and later calls for the same (round, ref) replace it."""
    token = (await turn_in(store, PENDING)).lease_token
    started = datetime.now(UTC)
    running = tool_call("t1", 1, "r1", ToolCallStatus.RUNNING, input={"amount": 5})
    await store.record_call("t1", lease_token=token, call=running.model_copy())
    await store.record_call(
        "t1", lease_token=token, call=tool_call("t1", 1, "r2", ToolCallStatus.REQUESTED)
    )

    done = running.model_copy(
        update={
            "status": ToolCallStatus.DONE,
            "output": {"id": "tx-1"},
            "started_at": started,
            "finished_at": datetime.now(UTC),
        }
    )
    await store.record_call("t1", lease_token=token, call=done)

    rows = await store.list_calls("t1")
    assert [(c.ref, c.status) for c in rows] == [
        ("r1", ToolCallStatus.DONE),
        ("r2", ToolCallStatus.REQUESTED),
    ]
    # The store stamps created_at on the first write and keeps it across updates.
    assert rows[0].created_at is not None and rows[0].created_at <= done.finished_at
    assert rows[0].model_copy(update={"created_at": None}) == done


async def test_list_calls_orders_by_round_then_ref(store: SessionStore) -> None:
    """list_calls returns the journal ordered by round (numerically) then ref."""
    token = (await turn_in(store, PENDING)).lease_token
    for round, ref in [(2, "a"), (10, "a"), (1, "b"), (2, "B"), (1, "a")]:
        await store.record_call("t1", lease_token=token, call=tool_call("t1", round, ref))

    rows = await store.list_calls("t1")

    assert [(c.round, c.ref) for c in rows] == [(1, "a"), (1, "b"), (2, "B"), (2, "a"), (10, "a")]
    assert {c.turn_id for c in rows} == {"t1"}


async def test_load_rounds_orders_rounds_and_includes_uncommitted(store: SessionStore) -> None:
    """load_rounds returns every saved round, committed or not, in round order."""
    token = (await turn_in(store, PENDING)).lease_token
    saved = {
        2: RoundRecord(round=2, messages=[asks("r2")], committed=False),
        1: RoundRecord(round=1, messages=[model_says("one")], committed=True),
    }
    for record in saved.values():
        await store.save_round("t1", lease_token=token, round=record)

    rounds = await store.load_rounds("t1")

    assert [(r.round, r.committed) for r in rounds] == [(0, True), (1, True), (2, False)]
    assert wire(rounds[2].messages) == wire(saved[2].messages)
    assert await store.load_rounds("nope") == []


# -- conversations -------------------------------------------------------------------------


async def test_load_conversation_excludes_uncommitted_rounds(store: SessionStore) -> None:
    """load_conversation holds round 0 and the committed rounds only, in round order."""
    hello = Message.user("hello")
    await store.create_turn(new_turn("t1", messages=[hello]))
    token = (await claim(store, "t1")).lease_token
    tool_message = Message(role="tool", content=[Part.of_response("transferMoney", "r1", 1)])
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=2, messages=[asks("r2")], committed=False),
    )
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks("r1"), tool_message], committed=True),
    )

    assert wire(await store.load_conversation("t1")) == wire([hello, asks("r1"), tool_message])


async def test_load_conversation_assembles_three_level_chain(store: SessionStore) -> None:
    """A turn's conversation is its parent's truncated to history_length plus its own rounds."""
    question = Message.user("send 10 to bob")
    await store.create_turn(new_turn("root", messages=[question]))
    token = (await claim(store, "root")).lease_token
    paused = asks("r1")
    await store.save_round(
        "root", lease_token=token, round=RoundRecord(round=1, messages=[paused], committed=True)
    )
    await settle(store, "root", COMPLETED, token)
    assert wire(await store.load_conversation("root")) == wire([question, paused])

    amended = Message(
        role="model",
        content=[Part.of_request("transferMoney", "r1", {"amount": 10}, {"resolved": True})],
    )
    answered = Message(role="tool", content=[Part.of_response("transferMoney", "r1", "ok")])
    await store.create_turn(
        new_turn(
            "child", kind="resume", parent_id="root", history_length=1, messages=[amended, answered]
        )
    )
    token = (await claim(store, "child")).lease_token
    for number, messages, committed in [(1, [model_says("sent")], True), (2, [asks("x")], False)]:
        await store.save_round(
            "child",
            lease_token=token,
            round=RoundRecord(round=number, messages=messages, committed=committed),
        )
    await settle(store, "child", COMPLETED, token)
    child_conversation = [question, amended, answered, model_says("sent")]
    assert wire(await store.load_conversation("child")) == wire(child_conversation)

    thanks = Message.user("thanks")
    grandchild = await store.create_turn(
        new_turn("grand", parent_id="child", history_length=4, messages=[thanks])
    )

    assert grandchild.history_length == 4
    child = await store.get_turn("child")
    assert child is not None and child.history_length == 1
    assert wire(await store.load_conversation("grand")) == wire([*child_conversation, thanks])
    assert wire(await store.load_conversation("root")) == wire([question, paused])


async def test_turn_without_rounds_shows_parent_prefix(store: SessionStore) -> None:
    """A turn with no rounds of its own (a retry) holds its parent's first history_length."""
    await store.create_turn(new_turn("root", messages=[Message.user("q")]))
    token = (await claim(store, "root")).lease_token
    await store.save_round(
        "root",
        lease_token=token,
        round=RoundRecord(round=1, messages=[model_says("a"), model_says("b")], committed=True),
    )
    await settle(store, "root", FAILED, token)

    await store.create_turn(new_turn("retry", kind="retry", parent_id="root", history_length=2))

    assert await store.load_rounds("retry") == []
    assert wire(await store.load_conversation("retry")) == wire(
        [Message.user("q"), model_says("a")]
    )


async def test_load_conversation_of_unknown_turn_raises_not_found(store: SessionStore) -> None:
    """load_conversation of an unknown turn raises NotFoundError."""
    with pytest.raises(NotFoundError):
        await store.load_conversation("nope")


async def test_read_snapshot_is_the_turn_with_its_conversation_and_journal(
    store: SessionStore,
) -> None:
    """read_snapshot returns what get_turn, load_conversation and list_calls return, together,
    for a resumed turn whose conversation spans its parent; None for an unknown turn."""
    paused = await paused_turn(store, "root", interrupted=("r2", "r1"))
    await store.create_turn(
        new_turn("child", kind="resume", parent_id="root", history_length=1),
        answers=[answer("root", "r1"), answer("root", "r2")],
    )
    token = (await claim(store, "child")).lease_token
    await settle(store, "child", COMPLETED, token)

    for turn_id in ("root", "child"):
        stored = await store.read_snapshot(turn_id)
        assert stored is not None
        assert stored.turn == await store.get_turn(turn_id)
        assert wire(stored.conversation) == wire(await store.load_conversation(turn_id))
        assert stored.journal == await store.list_calls(turn_id)
    root = await store.read_snapshot("root")
    assert root is not None and root.turn.status is paused.status
    assert [(c.ref, c.status) for c in root.journal] == [
        ("done", ToolCallStatus.DONE),
        ("r1", ToolCallStatus.ANSWERED),
        ("r2", ToolCallStatus.ANSWERED),
    ]
    assert all(c.created_at is not None and c.created_at.tzinfo for c in root.journal)
    assert await store.read_snapshot("nope") is None


async def test_read_progress_is_what_a_worker_reads_to_run_a_turn(store: SessionStore) -> None:
    """read_progress returns the parent's conversation and journal and the turn's own rounds
    (committed or not) and journal, as the separate reads do; a first turn has no parent
    part; an unknown turn gives None."""
    await paused_turn(store, "root", interrupted=("r1",))
    await store.create_turn(
        new_turn("child", kind="resume", parent_id="root", history_length=1),
        answers=[answer("root", "r1")],
    )
    token = (await claim(store, "child")).lease_token
    await store.save_round(
        "child",
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks("r9"), model_says("x")], committed=False),
        calls=[tool_call("child", 1, "r9", ToolCallStatus.RUNNING)],
    )

    child = await store.read_progress("child")
    assert child is not None
    assert wire(child.parent_conversation) == wire(await store.load_conversation("root"))
    assert child.parent_journal == await store.list_calls("root")
    assert child.rounds == await store.load_rounds("child")
    assert [(r.round, r.committed) for r in child.rounds] == [(1, False)]
    assert child.journal == await store.list_calls("child")
    assert [c.ref for c in child.journal] == ["r9"]
    root = await store.read_progress("root")
    assert root is not None
    assert (root.parent_conversation, root.parent_journal) == ([], [])
    assert root.rounds == await store.load_rounds("root")
    assert await store.read_progress("nope") is None


async def test_read_progress_hands_out_a_copy_the_runner_may_change(store: SessionStore) -> None:
    """What read_progress returns right after a claim (the SQL store keeps it from the claim)
    is the caller's own: the runner answers the paused message in place, and neither the
    stored conversation and journal nor a later read_progress see the change."""
    await paused_turn(store, "root", interrupted=("r1",))
    await store.create_turn(
        new_turn("child", kind="resume", parent_id="root", history_length=1),
        answers=[answer("root", "r1")],
    )
    await claim(store, "child")
    conversation, journal = (
        wire(await store.load_conversation("root")),
        await store.list_calls("root"),
    )

    progress = await store.read_progress("child")
    assert progress is not None and progress.parent_conversation
    paused = progress.parent_conversation[-1]
    paused.content[0].metadata = {"tampered": True}
    paused.content.append(Part.of_text("extra"))
    progress.parent_journal[0].status = ToolCallStatus.FAILED

    assert wire(await store.load_conversation("root")) == conversation
    assert await store.list_calls("root") == journal
    again = await store.read_progress("child")
    assert again is not None
    assert wire(again.parent_conversation) == conversation
    assert again.parent_journal == journal


# -- copies ------------------------------------------------------------------------------


#: A payload whose every value a careless JSON path changes: integers beyond 64 bits (2**100
#: + 1 has no float form; 2**63 is one past the signed range), a float that is not an
#: integer, a string of digits, text beyond ASCII, nesting and null.
EXACT_PAYLOAD = {
    "big": 2**100 + 1,
    "negative": -(2**70) - 1,
    "edge": 2**63,
    "float": 0.1,
    "digits": "12345678901234567890123",
    "text": "Überweisung ✓ \u2028",
    "nested": [[{"none": None, "yes": True}]],
}


async def test_json_payloads_come_back_exactly(store: SessionStore) -> None:
    """A round's messages and journal rows come back exactly as written, through the reads a
    worker and a client make: big integers stay integers, floats floats, text text."""
    token = (await turn_in(store, PENDING)).lease_token
    request = Message(role="model", content=[Part.of_request("transferMoney", "r1", EXACT_PAYLOAD)])
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[request], committed=True),
        calls=[tool_call("t1", 1, "r1", output=EXACT_PAYLOAD)],
    )

    def exact(value: Any) -> bool:
        return value == EXACT_PAYLOAD and all(
            type(value[key]) is type(written) for key, written in EXACT_PAYLOAD.items()
        )

    conversation = await store.load_conversation("t1")
    request_part = conversation[-1].content[0].tool_request
    assert request_part is not None and exact(request_part.input)
    assert exact((await store.list_calls("t1"))[0].output)
    progress = await store.read_progress("t1")
    assert progress is not None
    assert exact(progress.journal[0].output)
    saved = progress.rounds[-1].messages[0].content[0].tool_request
    assert saved is not None and exact(saved.input)


async def test_returned_messages_and_rows_are_copies(store: SessionStore) -> None:
    """Mutating messages, rounds or journal rows a store returned does not change the store."""
    token = (await turn_in(store, PENDING)).lease_token
    await store.record_call(
        "t1", lease_token=token, call=tool_call("t1", 1, "r1", output={"ids": [1]})
    )
    conversation = wire(await store.load_conversation("t1"))

    loaded = await store.load_conversation("t1")
    loaded[0].content[0].text = "tampered"
    loaded[0].content.append(Part.of_text("extra"))
    loaded.append(model_says("extra"))
    rounds = await store.load_rounds("t1")
    rounds[0].messages[0].content[0].text = "tampered"
    rounds[0].committed = False
    rows = await store.list_calls("t1")
    rows[0].output["ids"].append(2)
    rows[0].status = ToolCallStatus.FAILED

    assert wire(await store.load_conversation("t1")) == conversation
    assert [r.committed for r in await store.load_rounds("t1")] == [True]
    assert [(c.status, c.output) for c in await store.list_calls("t1")] == [
        (ToolCallStatus.DONE, {"ids": [1]})
    ]


async def test_returned_turn_and_session_records_are_copies(store: SessionStore) -> None:
    """Assigning fields of a returned TurnRecord or SessionRecord does not change the store."""
    created = await store.create_turn(new_turn("t1", owner="alice"))
    created.status = FAILED
    created.attempts = 99
    claimed = await claim(store, "t1")
    claimed.lease_owner = "thief"
    claimed.lease_token = 42
    read = await store.get_turn("t1")
    assert read is not None
    read.status = ABORTED
    session = await store.get_session("s1")
    assert session is not None
    session.agent = "other"
    session.owner = "mallory"

    current = await store.get_turn("t1")
    assert current is not None
    assert (current.status, current.attempts, current.lease_owner, current.lease_token) == (
        PENDING,
        1,
        "w1",
        1,
    )
    again = await store.get_session("s1")
    assert again is not None and (again.agent, again.owner) == (AGENT, "alice")


async def test_nested_values_of_returned_records_are_copies(store: SessionStore) -> None:
    """Mutating the input or error inside a returned TurnRecord does not change the store."""
    created = await store.create_turn(new_turn("t1", messages=[Message.user("hi")]))
    assert created.input.message is not None
    created.input.message.content[0].text = "tampered"
    read = await store.get_turn("t1")
    assert read is not None
    read.input.respond.append(Part.of_text("injected"))
    token = (await claim(store, "t1")).lease_token
    error = TurnError(status="INTERNAL", message="boom", details={"trace": ["a"]})
    failed = await store.transition(
        "t1", Transition(expected={PENDING}, new=FAILED, lease_token=token, error=error)
    )
    assert failed.error is not None
    failed.error.details["trace"].append("tampered")
    error.message = "changed by the caller"

    current = await store.get_turn("t1")
    assert current is not None and current.input.message is not None
    assert current.input.message.to_wire() == Message.user("hi").to_wire()
    assert current.input.respond == []
    assert current.error == TurnError(status="INTERNAL", message="boom", details={"trace": ["a"]})


async def test_store_does_not_alias_the_new_turn_it_was_given(store: SessionStore) -> None:
    """Mutating the NewTurn after create_turn does not change the stored turn."""
    turn = new_turn("t1", messages=[Message.user("hi")])
    await store.create_turn(turn)

    assert turn.input.message is not None
    turn.input.message.content[0].text = "tampered"
    turn.initial_messages[0].content[0].text = "tampered"

    current = await store.get_turn("t1")
    assert current is not None and current.input.message is not None
    assert current.input.message.to_wire() == Message.user("hi").to_wire()
    assert wire(await store.load_conversation("t1")) == wire([Message.user("hi")])


# -- payload fidelity ----------------------------------------------------------------------

NESTED = {
    "name": "Zoë Ångström — 日本語 🚀",
    "amounts": [0, -1, 2.5, 10**12],
    "flags": {"on": True, "off": False, "none": None},
    "empty": {"list": [], "dict": {}, "text": ""},
    "deep": [[{"k": ['"quoted"', "back\\slash", "new\nline", "tab\t"]}]],
}


async def test_tool_call_payloads_round_trip_exactly(store: SessionStore) -> None:
    """Journal payloads (None and falsy outputs, nested unicode JSON) read back exactly."""
    token = (await turn_in(store, PENDING)).lease_token
    outputs: dict[str, Any] = {
        "a-none": None,
        "b-false": False,
        "c-zero": 0,
        "d-empty-text": "",
        "e-empty-list": [],
        "f-nested": NESTED,
    }
    rows = [
        tool_call(
            "t1",
            1,
            ref,
            input=NESTED,
            output=output,
            interrupt={"question": "Überweisen?", "default": None},
            resumed={"approved": True, "note": None},
            error=TurnError(status="INTERNAL", message="ünïcode", details=NESTED),
        )
        for ref, output in outputs.items()
    ]
    await store.save_round(
        "t1",
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks(*outputs)], committed=False),
        calls=rows[:3],
    )
    for row in rows[3:]:
        await store.record_call("t1", lease_token=token, call=row)

    loaded = await store.list_calls("t1")

    assert [c.model_copy(update={"created_at": None}) for c in loaded] == rows
    assert [c.output for c in loaded] == list(outputs.values())
    assert loaded[0].output is None and loaded[1].output is False


async def test_answers_round_trip_exactly(store: SessionStore) -> None:
    """An interrupt answer holding None and nested unicode JSON reads back exactly."""
    await paused_turn(store, "p1")
    decision = {"restart": {"approved": None, "payload": NESTED}}

    await store.create_turn(
        new_turn("t2", kind="resume", parent_id="p1"),
        answers=[InterruptAnswer(turn_id="p1", round=1, ref="r1", answer=decision)],
    )

    assert (await calls_by_ref(store, "p1"))["r1"].answer == decision


async def test_message_payloads_round_trip_exactly(store: SessionStore) -> None:
    """Messages keep every key that was set, including explicit nulls such as pendingOutput."""
    paused_request = Part.of_request(
        "transferMoney",
        "r1",
        NESTED,
        {"interrupt": {"why": "größer als 100 €"}, "pendingOutput": None},
    )
    model = Message(
        role="model",
        content=[Part.of_text("Überweisung 🚀"), paused_request],
        metadata={"pendingOutput": None, "nested": NESTED},
    )
    tool = Message(role="tool", content=[Part.of_response("transferMoney", "r0", None)])
    user = Message(role="user", content=[Part.of_text("日本語")], metadata={"pendingOutput": None})
    await store.create_turn(new_turn("t1", messages=[user]))
    token = (await claim(store, "t1")).lease_token
    await store.save_round(
        "t1", lease_token=token, round=RoundRecord(round=1, messages=[model, tool], committed=True)
    )

    loaded = await store.load_conversation("t1")

    assert wire(loaded) == wire([user, model, tool])
    assert wire((await store.load_rounds("t1"))[1].messages) == wire([model, tool])
    assert loaded[0].metadata == {"pendingOutput": None}
    assert loaded[1].metadata is not None and "pendingOutput" in loaded[1].metadata
    part_metadata = loaded[1].content[1].metadata
    assert part_metadata is not None and "pendingOutput" in part_metadata
    assert part_metadata["pendingOutput"] is None
    response = loaded[2].content[0].tool_response
    assert response is not None and "output" in response.to_wire()
    turn = await store.get_turn("t1")
    assert turn is not None and turn.input.message is not None
    assert turn.input.message.to_wire() == user.to_wire()


async def test_turn_input_round_trips_exactly(store: SessionStore) -> None:
    """A resume input's respond and restart parts, with metadata and null outputs, read back."""
    respond = [Part.of_response("transferMoney", "r1", None, {"note": "ok ✓"})]
    restart = [Part.of_request("transferMoney", "r2", NESTED, {"resumed": {"approved": None}})]
    turn = new_turn("t1", kind="resume", messages=[])
    turn.input = TurnInput(kind="resume", respond=respond, restart=restart)

    await store.create_turn(turn)

    stored = await store.get_turn("t1")
    assert stored is not None
    assert (stored.input.kind, stored.input.message) == ("resume", None)
    assert wire_parts(stored.input.respond) == wire_parts(respond)
    assert wire_parts(stored.input.restart) == wire_parts(restart)


# -- rules added after review --------------------------------------------------------------


async def test_answers_must_decide_calls_of_the_parent_once(store: SessionStore) -> None:
    """Answers naming another turn's call, or one call twice, are refused and write nothing."""
    await paused_turn(store, "p1", interrupted=("r1", "r2"))
    await paused_turn(store, "q1", "s2")
    with pytest.raises(InvalidArgumentError):
        await store.create_turn(
            new_turn("t2", kind="resume", parent_id="p1"), answers=[answer("q1", "r1")]
        )
    with pytest.raises(InvalidArgumentError):
        await store.create_turn(
            new_turn("t2", kind="resume", parent_id="p1"),
            answers=[answer("p1", "r1"), answer("p1", "r1", False)],
        )
    assert await store.get_turn("t2") is None
    statuses = {c.ref: c.status for c in await store.list_calls("p1")}
    assert statuses["r1"] is ToolCallStatus.INTERRUPTED
    assert {c.status for c in await store.list_calls("q1") if c.ref == "r1"} == {
        ToolCallStatus.INTERRUPTED
    }


async def test_hand_back_fences_out_the_worker_that_handed_back(store: SessionStore) -> None:
    """After a pending→pending hand-back the old lease token can write nothing."""
    await store.create_turn(new_turn("t1"))
    token = (await claim(store, "t1")).lease_token
    handed = await store.transition(
        "t1",
        Transition(expected={PENDING}, new=PENDING, lease_token=token, run_after=datetime.now(UTC)),
    )
    assert handed.lease_token != token
    with pytest.raises(LeaseLostError):
        await store.record_call("t1", lease_token=token, call=tool_call("t1", 1, "r1"))
    with pytest.raises(LeaseLostError):
        await store.transition(
            "t1", Transition(expected={PENDING}, new=COMPLETED, lease_token=token)
        )


async def test_settling_replaces_an_earlier_attempts_error(store: SessionStore) -> None:
    """A turn that failed transiently and then completed carries no error."""
    await store.create_turn(new_turn("t1"))
    token = (await claim(store, "t1")).lease_token
    await store.transition(
        "t1",
        Transition(
            expected={PENDING},
            new=PENDING,
            lease_token=token,
            error=TurnError(status="UNAVAILABLE", message="flaky"),
            run_after=datetime.now(UTC),
        ),
    )
    assert (await store.get_turn("t1")).error is not None
    settled = await settle(store, "t1")
    assert settled.error is None and (await store.get_turn("t1")).error is None


async def test_a_claim_settles_an_aborting_turn_whose_worker_died(store: SessionStore) -> None:
    """An aborting turn with an expired lease is settled aborted by the next claim."""
    await store.create_turn(new_turn("t1"))
    # Long enough that the abort surely lands while the lease is live, on a loaded machine.
    await claim(store, "t1", lease_seconds=1.0)
    assert await store.request_abort("t1") is ABORTING
    await asyncio.sleep(1.1)
    assert await store.claim_next(owner="w2", lease_seconds=LEASE) == []
    settled = await store.get_turn("t1")
    assert settled is not None and settled.status is TurnStatus.ABORTED
    assert settled.finish_reason is FinishReason.ABORTED
    await store.create_turn(new_turn("t2", parent_id="t1"))  # the session is free again
