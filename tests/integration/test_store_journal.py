"""The SessionStore contract on rounds and the tool-call journal: what a worker saves
while a turn runs, fenced by its lease, and how it reads back.

Every test runs on each store of
:data:`~tests.integration.store_support.STORE_FACTORIES` (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from engine.conversation.parts import Message, Part
from engine.errors import LeaseLostError
from engine.status import FinishReason
from engine.store import RoundRecord, SessionStore, ToolCallStatus, Transition
from tests.integration.store_support import (
    ABORTING,
    COMPLETED,
    FAILED,
    PENDING,
    SHORT_LEASE,
    asks,
    claim,
    model_says,
    new_turn,
    settle,
    tool_call,
    turn_in,
    wire,
)

# -- rounds and journal ------------------------------------------------------------------


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
    assert done.finished_at is not None
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
