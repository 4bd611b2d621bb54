"""A caller waiting for a queued turn nobody runs: a warning once, ``timeout=`` and
``worker_wait=``.

Real SQL stores (PostgreSQL and SQLite) and, once the turn should run, a real worker pool in
the test process.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from engine import Engine, ScriptedModel, TurnStatus
from engine.conversation.parts import Message
from engine.errors import NoWorkerError, TurnTimeoutError
from engine.store import TurnInput
from engine.turns.request import TurnRequest
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from workers import WorkerPool

BACKENDS = ["postgres", "sqlite"]


def user_message(text: str) -> TurnRequest:
    """A new session's first turn, saying ``text``."""
    return TurnRequest(input=TurnInput(kind="message", message=Message.user(text)))


def unclaimed_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings about unclaimed turns logged so far."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and "no worker has claimed it" in record.getMessage()
    ]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_unclaimed_turn_is_logged_once_and_a_timeout_leaves_it_pending(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No worker: the wait warns once after ``unclaimed_warning`` seconds, then ``timeout``
    raises the typed error naming the pending snapshot and how to wait again or abort; a
    worker started later runs the turn, and the chat continues from it."""
    caplog.set_level(logging.WARNING, logger="turnstile.agent")
    async with sql_store(backend) as store:
        ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
        agent = ai.define_agent(name="queued", store=store)
        agent.unclaimed_warning = 0.2
        agent.poll_interval = 0.05
        chat = agent.chat()
        with pytest.raises(TurnTimeoutError) as expired:
            await chat.send("hello later", timeout=1.0)
        error = expired.value
        assert error.status == "DEADLINE_EXCEEDED"
        assert isinstance(error, TimeoutError)
        assert error.snapshot_id is not None
        assert "not claimed by any worker" in error.message
        assert f"agent.wait('{error.snapshot_id}')" in error.message
        assert f"agent.abort('{error.snapshot_id}')" in error.message
        [line] = unclaimed_lines(caplog)
        assert error.snapshot_id in line and "queued" in line
        pending = await store.get_turn(error.snapshot_id)
        assert pending is not None
        assert pending.status is TurnStatus.PENDING and pending.attempts == 0

        async with WorkerPool(ai, store, poll_interval=0.05, scheduler=False):
            settled = await agent.wait(error.snapshot_id, timeout=10)
            assert settled.text == "Echo: hello later"
            follow_up = await chat.send("and now", timeout=10)
        assert follow_up.text == "Echo: and now"
        assert len(follow_up.messages) == 4  # the chat continued from the timed-out turn
    assert len(unclaimed_lines(caplog)) == 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_turn_claimed_in_time_is_not_reported(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With a worker running, a send that takes longer than the warning time stays quiet."""
    caplog.set_level(logging.WARNING, logger="turnstile.agent")
    async with sql_store(backend) as store:
        ai = Engine(model=ScriptedModel(slow_chunk_delay=0.1), state_keys=TEST_STATE_KEYS)
        agent = ai.define_agent(name="queued", store=store)
        agent.unclaimed_warning = 0.2
        agent.poll_interval = 0.05
        async with WorkerPool(ai, store, poll_interval=0.05, scheduler=False):
            response = await agent.chat().send("slow one two three four five", timeout=10)
    assert response.text == "Echo: slow one two three four five"
    assert unclaimed_lines(caplog) == []


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_worker_wait_ends_the_wait_for_an_unclaimed_turn_and_keeps_it_queued(
    backend: str,
) -> None:
    """``worker_wait``: no worker claims the turn in time, so the wait (which has no
    ``timeout``, and whose poll interval is longer) ends with the typed error naming the turn,
    which stays queued and runs once a worker comes."""
    async with sql_store(backend) as store:
        ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
        agent = ai.define_agent(name="queued", store=store)
        agent.poll_interval = 30.0
        request = user_message("hello later")
        with pytest.raises(NoWorkerError) as unclaimed:
            await asyncio.wait_for(agent.run_turn(request, worker_wait=0.3), 10)
        error = unclaimed.value
        assert error.status == "UNAVAILABLE"
        assert error.snapshot_id is not None and error.snapshot_id in error.message
        queued = await store.get_turn(error.snapshot_id)
        assert queued is not None
        assert queued.status is TurnStatus.PENDING and queued.attempts == 0

        async with WorkerPool(ai, store, poll_interval=0.05, scheduler=False):
            settled = await agent.wait(error.snapshot_id, timeout=10)
        assert settled.text == "Echo: hello later"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_worker_wait_does_not_end_the_wait_for_a_claimed_turn(backend: str) -> None:
    """A turn a worker claimed before ``worker_wait`` passed is waited for to its end, however
    long it runs."""
    async with sql_store(backend) as store:
        ai = Engine(model=ScriptedModel(slow_chunk_delay=0.2), state_keys=TEST_STATE_KEYS)
        agent = ai.define_agent(name="queued", store=store)
        agent.poll_interval = 0.05
        request = user_message("slow one two three four five")
        async with WorkerPool(ai, store, poll_interval=0.05, scheduler=False):
            response = await agent.run_turn(request, worker_wait=0.3, timeout=10)
    assert response.text == "Echo: slow one two three four five"
