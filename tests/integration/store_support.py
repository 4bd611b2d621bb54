"""The SessionStore contract's shared parts: the stores under test and the helpers that
build turns, rounds and journal rows in them.

The contract suite is the ``tests/integration/test_store_*.py`` modules; each of their tests
runs once per entry of :data:`STORE_FACTORIES` (through the ``store`` fixture of
``tests/integration/conftest.py``): the in-memory reference implementation and
``SqlSessionStore`` on SQLite and on PostgreSQL. Another store joins by adding one line to
:data:`STORE_FACTORIES`: a name mapped to a zero-argument callable returning an async context
manager that yields a fresh, empty store (and tears its database down on exit).

:data:`KNOWN_FAILURES` lists (factory, test) pairs that currently violate the contract; they
run as strict ``xfail``, so fixing the store turns them red until the entry is removed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from engine.approvals.rules import decision_rule
from engine.conversation.parts import Message, Part
from engine.status import FinishReason, TurnStatus
from engine.store import (
    Assignment,
    InterruptAnswer,
    NewTurn,
    RoundRecord,
    SessionStore,
    ToolCallRecord,
    ToolCallStatus,
    Transition,
    TurnInput,
    TurnRecord,
)
from engine.store.memory import InMemorySessionStore
from tests.databases import sql_store

PENDING, ABORTING = TurnStatus.PENDING, TurnStatus.ABORTING
COMPLETED, FAILED, ABORTED = TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.ABORTED
SETTLED = (COMPLETED, FAILED, ABORTED)
FINISH = {COMPLETED: FinishReason.STOP, FAILED: FinishReason.FAILED, ABORTED: FinishReason.ABORTED}
AGENT = "banker"
LEASE = 30.0
SHORT_LEASE = 0.05
CLOCK_SLACK = timedelta(seconds=5)


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
    return (await store.claim_turn(turn_id, owner=owner, lease_seconds=lease_seconds)).turn


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
        assert (await store.request_abort(turn_id)).status is ABORTING
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
    **fields: Any,
) -> TurnRecord:
    """A turn settled ``completed/interrupted`` at ``interrupted`` calls, plus one done call
    (``fields``: more of its :class:`NewTurn`, e.g. its version)."""
    await store.create_turn(new_turn(turn_id, session_id, **fields))
    token = (await claim(store, turn_id)).lease_token
    calls = [tool_call(turn_id, 1, ref, ToolCallStatus.INTERRUPTED) for ref in interrupted]
    calls.append(tool_call(turn_id, 1, "done", output={"ok": True}))
    await store.save_round(
        turn_id,
        lease_token=token,
        round=RoundRecord(round=1, messages=[asks(*interrupted, "done")], committed=True),
        calls=calls,
    )
    return await settle_interrupted(store, turn_id, token)


async def settle_interrupted(
    store: SessionStore,
    turn_id: str,
    token: int,
    calls: Sequence[ToolCallRecord] = (),
    round: RoundRecord | None = None,
) -> TurnRecord:
    """Settle the leased turn ``completed`` / ``interrupted``, writing ``round`` and ``calls``
    with the settle."""
    return await store.transition(
        turn_id,
        Transition(
            expected={PENDING},
            new=COMPLETED,
            lease_token=token,
            finish_reason=FinishReason.INTERRUPTED,
            round=round,
            calls=list(calls),
        ),
    )


async def latest_id(store: SessionStore, session_id: str = "s1") -> str | None:
    """The id of the session's latest turn."""
    latest = await store.latest_turn(session_id)
    return None if latest is None else latest.id


async def calls_by_ref(store: SessionStore, turn_id: str) -> dict[str, ToolCallRecord]:
    """The journal of ``turn_id`` keyed by ref."""
    return {c.ref: c for c in await store.list_calls(turn_id)}


async def record_decision(
    store: SessionStore,
    turn_id: str,
    round: int,
    ref: str,
    *,
    answer: Any,
    decided_by: str | None,
    assignment_seen: Assignment | None = None,
) -> ToolCallRecord:
    """Record a decision on an open approval as the inbox does, through the engine's
    decision rule; the decided journal row."""
    outcome = await store.change_approval(
        turn_id,
        round,
        ref,
        decision_rule(answer, decided_by=decided_by, assignment_seen=assignment_seen),
    )
    assert outcome.decided is not None, "a decision rule always decides"
    return outcome.decided
