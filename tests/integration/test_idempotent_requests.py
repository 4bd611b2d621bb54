"""A request repeated after a timeout or a lost answer creates nothing twice.

A caller may pass an idempotency key (``send``/``resume``, or the ``Idempotency-Key`` header
over HTTP): the same request under the same key answers with the turn the first one created.
And a creation whose commit landed but whose answer was lost is read back and reported as the
success it was, not as an error. Runs on the in-memory store, SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from engine.errors import InvalidArgumentError, StoreError
from engine.remote.client import remote_agent
from engine.status import TurnStatus
from engine.store import ClaimedTurn, InterruptAnswer, NewTurn, SessionStore, TurnRecord
from engine.turns.executor import LeaseSettings
from examples.banking import build
from tests.conftest import TEST_STATE_KEYS
from tests.http_fixtures import Served, bearer, serve_banking, token_auth


async def test_the_same_send_under_one_key_creates_one_turn(store: SessionStore) -> None:
    """A send repeated under its idempotency key answers with the first send's turn."""
    agent = build(store=store, execution="inline", state_keys=TEST_STATE_KEYS).banking_agent
    first = await agent.chat().send("Transfer $500 to savings.", idempotency_key="k-1")
    again = await agent.chat().send("Transfer $500 to savings.", idempotency_key="k-1")

    assert again.snapshot_id == first.snapshot_id
    assert again.session_id == first.session_id
    assert [i.ref for i in again.interrupts] == ["approval-1"]
    other = await agent.chat().send("Transfer $500 to savings.", idempotency_key="k-2")
    assert other.session_id != first.session_id


async def test_a_resume_repeated_under_its_key_transfers_once(store: SessionStore) -> None:
    """A resume repeated under its key (from another chat on the paused snapshot) answers
    with the same settled turn: the approval is not refused as decided, nor run twice."""
    app = build(store=store, execution="inline", state_keys=TEST_STATE_KEYS)
    paused = await app.banking_agent.chat().send("Transfer $500 to savings.")
    answer = [paused.interrupts[0].respond({"approved": True})]

    done = await app.banking_agent.chat(snapshot_id=paused.snapshot_id).resume(
        respond=answer, idempotency_key="approve-1"
    )
    again = await app.banking_agent.chat(snapshot_id=paused.snapshot_id).resume(
        respond=answer, idempotency_key="approve-1"
    )

    assert again.snapshot_id == done.snapshot_id
    assert again.text == done.text == "Done. Transaction txn-500-savings."
    assert len(app.transfers) == 1


async def test_a_different_request_under_a_used_key_is_refused(store: SessionStore) -> None:
    """A key names one request: another request under it is INVALID_ARGUMENT, writing
    nothing."""
    agent = build(store=store, execution="inline", state_keys=TEST_STATE_KEYS).banking_agent
    first = await agent.chat().send("hello", idempotency_key="k-1")

    with pytest.raises(InvalidArgumentError) as refused:
        await agent.chat(session_id=first.session_id).send("other", idempotency_key="k-1")

    assert "already used for a different request" in refused.value.message
    latest = await agent.get_snapshot(session_id=first.session_id)
    assert latest is not None and latest.snapshot_id == first.snapshot_id


class LostAnswers:
    """A real store whose next creation loses its answer: the write is made (``commit``)
    or not, then the caller is told the connection dropped, as a driver reports it."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.commit = True
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def create_turn(
        self, turn: NewTurn, *, answers: Sequence[InterruptAnswer] = ()
    ) -> TurnRecord:
        if not self.armed:
            return await self.store.create_turn(turn, answers=answers)
        self.armed = False
        if self.commit:
            await self.store.create_turn(turn, answers=answers)
        raise StoreError("Database error: connection lost", may_have_applied=True)

    async def create_claimed_turn(
        self,
        turn: NewTurn,
        *,
        answers: Sequence[InterruptAnswer] = (),
        owner: str,
        lease_seconds: float,
    ) -> ClaimedTurn:
        async def create() -> ClaimedTurn:
            return await self.store.create_claimed_turn(
                turn, answers=answers, owner=owner, lease_seconds=lease_seconds
            )

        if not self.armed:
            return await create()
        self.armed = False
        if self.commit:
            await create()
        raise StoreError("Database error: connection lost", may_have_applied=True)


async def test_a_creation_whose_answer_was_lost_is_read_back_as_a_success(
    store: SessionStore,
) -> None:
    """A send whose creation committed but whose answer was lost succeeds with that turn,
    run once the lease its creation gave this caller expires (the caller cannot tell its
    own lost creation from a run of the same turn elsewhere in the process)."""
    lossy = LostAnswers(store)
    lease = LeaseSettings(lease_seconds=0.3, heartbeat_interval=0.1)
    app = build(store=lossy, execution="inline", lease=lease, state_keys=TEST_STATE_KEYS)
    agent = app.banking_agent

    response = await agent.chat().send("hello")

    assert response.status is TurnStatus.COMPLETED
    assert response.text == "Echo: hello"
    assert response.snapshot_id is not None
    assert await store.get_turn(response.snapshot_id) is not None


async def test_a_creation_that_did_not_apply_says_so(store: SessionStore) -> None:
    """A send whose creation failed with a lost connection and did not commit raises
    StoreError with status UNAVAILABLE, saying (after reading back) it was not applied."""
    lossy = LostAnswers(store)
    lossy.commit = False
    agent = build(store=lossy, execution="inline", state_keys=TEST_STATE_KEYS).banking_agent

    with pytest.raises(StoreError) as failed:
        await agent.chat().send("hello")

    assert failed.value.status == "UNAVAILABLE"
    assert failed.value.may_have_applied is False


@pytest.fixture(params=["memory", "postgres"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """The banking app over HTTP behind bearer tokens."""
    async with serve_banking(request.param, auth=token_auth()) as served:
        yield served


async def test_an_idempotency_key_header_makes_a_retried_post_safe(served: Served) -> None:
    """Two POSTs with one Idempotency-Key answer with one turn; a hostile key is a 400."""
    body = {"data": {"message": {"role": "user", "content": [{"text": "hello"}]}}, "init": {}}
    headers = {**bearer("tok-alice"), "Idempotency-Key": "retry-me"}
    first = await served.http.post(served.agent_url, json=body, headers=headers)
    again = await served.http.post(served.agent_url, json=body, headers=headers)

    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json()["result"]["snapshotId"] == first.json()["result"]["snapshotId"]
    if served.is_sql:
        assert served.row_counts()["turns"] == 1
    bob = await served.http.post(
        served.agent_url, json=body, headers={**bearer("tok-bob"), "Idempotency-Key": "retry-me"}
    )
    assert bob.json()["result"]["snapshotId"] != first.json()["result"]["snapshotId"]

    hostile = await served.http.post(
        served.agent_url, json=body, headers={**bearer("tok-alice"), "Idempotency-Key": "x" * 300}
    )
    assert hostile.status_code == 400, hostile.text
    assert "Idempotency-Key" in hostile.json()["message"]


async def test_the_python_remote_client_sends_its_idempotency_key(served: Served) -> None:
    """RemoteChat.send(idempotency_key=...) repeated answers with the first turn."""
    async with remote_agent(served.agent_url, headers=bearer("tok-alice")) as agent:
        first = await agent.chat().send("hello", idempotency_key="remote-1")
        again = await agent.chat().send("hello", idempotency_key="remote-1")
    assert first.snapshot_id is not None
    assert again.snapshot_id == first.snapshot_id
    assert again.text == "Echo: hello"
