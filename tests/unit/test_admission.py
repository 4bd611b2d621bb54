"""``TurnAdmission`` on its own: the reservations of one principal, step by step, on the
in-memory store (paused inside its read to order the steps exactly)."""

from __future__ import annotations

import asyncio

import pytest

from engine.conversation.parts import Message
from engine.errors import TooManyTurnsError
from engine.remote.admission import Reservation, TurnAdmission
from engine.store import TurnInput
from engine.turns.request import TurnRequest
from examples.banking import build
from stores import InMemorySessionStore
from tests.conftest import TEST_STATE_KEYS


class PausedReads(InMemorySessionStore):
    """The in-memory store, whose in-flight read waits for ``resume`` when ``pause`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.pause = False
        self.reading = asyncio.Event()
        self.resume = asyncio.Event()

    async def active_turn_ids(self, owner: str | None, *, limit: int) -> list[str]:
        if self.pause:
            self.reading.set()
            await self.resume.wait()
        return await super().active_turn_ids(owner, limit=limit)


def request(owner: str | None = "alice", key: str | None = None) -> TurnRequest:
    message = Message.model_validate({"role": "user", "content": [{"text": "hi"}]})
    return TurnRequest(
        input=TurnInput(kind="message", message=message), owner=owner, idempotency_key=key
    )


async def test_a_reservation_given_back_during_a_read_loses_no_other() -> None:
    """R1 is answered while R2 reads the store: R2's reservation must still count, so with a
    limit of 2 the third request in flight is refused."""
    store = PausedReads()
    app = build(store=store, state_keys=TEST_STATE_KEYS, execution="workers")
    admission = TurnAdmission(app.ai, 2)
    agent = app.banking_agent
    first, second = Reservation(), Reservation()
    await admission.admit(agent, request(), first)
    store.pause = True
    reading = asyncio.create_task(admission.admit(agent, request(), second))
    await store.reading.wait()
    first.release()  # R1 answered: alice's last reservation but the one R2 is making
    store.pause = False
    store.resume.set()
    await reading
    await admission.admit(agent, request(), Reservation())
    with pytest.raises(TooManyTurnsError):
        await admission.admit(agent, request(), Reservation())


async def test_a_turn_id_is_fixed_at_admission_and_a_key_keeps_its_own() -> None:
    """Admission chooses the turn id it counts: the idempotency key's id when there is one."""
    app = build(store=InMemorySessionStore(), state_keys=TEST_STATE_KEYS, execution="workers")
    admission = TurnAdmission(app.ai, 1)
    plain = await admission.admit(app.banking_agent, request(), Reservation())
    assert plain.turn_id is not None
    keyed = await admission.admit(app.banking_agent, request("bob", "k1"), Reservation())
    again = await admission.admit(app.banking_agent, request("bob", "k1"), Reservation())
    assert keyed.turn_id == again.turn_id and keyed.turn_id is not None
    assert keyed.turn_id.startswith("key-")


def test_a_limit_below_one_is_refused() -> None:
    app = build(store=InMemorySessionStore(), state_keys=TEST_STATE_KEYS)
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="max_turns_per_principal"):
            TurnAdmission(app.ai, bad)
