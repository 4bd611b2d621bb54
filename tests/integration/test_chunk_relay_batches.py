"""Relayed chunks on PostgreSQL: batched, complete, in order, the tail before the settle.

The caller and the worker use two stores on one database, as two processes would: chunks
reach the caller only through NOTIFY.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine import Agent, Engine, ScriptedModel
from stores import SqlSessionStore
from stores.postgres import PostgresSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import postgres_url
from workers import WorkerPool

WORDS = " ".join(f"word{i}" for i in range(4000))


@pytest.fixture
async def stores() -> AsyncIterator[tuple[PostgresSessionStore, PostgresSessionStore]]:
    """The caller's store and the worker's, on one fresh database."""
    with postgres_url() as url:
        caller, worker = SqlSessionStore(url), SqlSessionStore(url)
        assert isinstance(caller, PostgresSessionStore)
        assert isinstance(worker, PostgresSessionStore)
        try:
            yield caller, worker
        finally:
            await caller.close()
            await worker.close()


def agent_on(store: SqlSessionStore) -> tuple[Engine, Agent]:
    """An engine whose echo agent queues its turns in ``store``."""
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    return ai, ai.define_agent(name="echo", store=store)


async def stream(agent: Agent, text: str) -> tuple[list[str], str]:
    """The chunk texts of one streamed turn, and its answer."""
    turn = agent.chat().send_stream(text)
    texts = [chunk.text async for chunk in turn.stream]
    return texts, (await turn.response).text


async def test_a_streamed_long_echo_arrives_whole_in_few_transactions(
    stores: tuple[PostgresSessionStore, PostgresSessionStore],
) -> None:
    """4,001 chunks, in order, from a handful of batches (one transaction each); a turn
    nobody streams sends none."""
    caller, worker = stores
    _, agent = agent_on(caller)
    worker_ai, _ = agent_on(worker)
    async with WorkerPool(worker_ai, worker, poll_interval=0.05, scheduler=False):
        texts, answer = await stream(agent, WORDS)
        assert "".join(texts) == answer == f"Echo: {WORDS}"
        assert len(texts) == 4001
        assert 0 < worker.relay.batches_sent <= len(texts) // 100
        batches = worker.relay.batches_sent
        plain = await agent.chat().send(WORDS)
        assert plain.text == f"Echo: {WORDS}"
        assert worker.relay.batches_sent == batches


async def test_the_tail_arrives_before_the_settle_however_long_the_interval(
    stores: tuple[PostgresSessionStore, PostgresSessionStore],
) -> None:
    """With timed batches switched off, nothing leaves until the settle — and the settle
    sends the buffered chunks first: the caller still gets every one."""
    caller, worker = stores
    worker.relay.interval = 3600
    worker.relay.batch_bytes = 10**9
    _, agent = agent_on(caller)
    worker_ai, _ = agent_on(worker)
    async with WorkerPool(worker_ai, worker, poll_interval=0.05, scheduler=False):
        for round_ in range(3):
            texts, answer = await stream(agent, f"round {round_} {WORDS}")
            assert "".join(texts) == answer
    assert worker.relay.batches_sent == 3
