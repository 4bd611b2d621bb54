"""The monitoring statements (stores/monitoring.py) on PostgreSQL and SQLite: what a probe and
a scrape read, against turns made through the engine's own API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from examples.banking import build
from stores import SqlSessionStore
from stores.migrate import head_revision
from stores.monitoring import MonitoringDatabase
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from workers.metrics import Metrics

TRANSFER = "Transfer $500 to my savings account"


@pytest.fixture(params=["postgres", "sqlite"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SqlSessionStore]:
    async with sql_store(request.param) as opened:
        yield opened


async def test_gauges_read_open_approvals_the_queue_and_active_turns(
    store: SqlSessionStore,
) -> None:
    """A paused turn is one open approval; a queued turn nobody claimed is one claimable,
    pending turn; agents with neither do not appear."""
    inline = build(store=store, execution="inline", state_keys=TEST_STATE_KEYS)
    paused = await inline.banking_agent.chat().send(TRANSFER)
    assert paused.finish_reason is not None and paused.finish_reason.value == "interrupted"
    queued = build(store=store, execution="workers", state_keys=TEST_STATE_KEYS)
    waiting = await queued.banking_agent.chat().send("hello", wait=False)
    assert waiting.status.value == "pending"

    database = MonitoringDatabase(store.db.url)
    try:
        assert database.schema_revision() == head_revision()
        now = datetime.now(UTC) + timedelta(seconds=1)
        gauges = database.read_gauges(now)
    finally:
        database.dispose()
    assert set(gauges.agents) == {"bankingAgent"}
    agent = gauges.agents["bankingAgent"]
    assert agent.turns == {"pending": 1}
    assert (agent.running, agent.queued, agent.open_approvals) == (0, 1, 1)
    assert agent.oldest_queued is not None and agent.oldest_queued <= now
    assert agent.oldest_approval is not None and agent.oldest_approval <= agent.oldest_queued


async def test_a_turn_due_later_is_pending_but_not_queued(store: SqlSessionStore) -> None:
    """Read as of a moment before the turn's run_after, the turn is pending but not yet
    claimable: the queue counts only what a worker could claim now."""
    queued = build(store=store, execution="workers", state_keys=TEST_STATE_KEYS)
    waiting = await queued.banking_agent.chat().send("hello", wait=False)
    turn = await store.get_turn(str(waiting.snapshot_id))
    assert turn is not None
    database = MonitoringDatabase(store.db.url)
    try:
        gauges = database.read_gauges(turn.run_after - timedelta(seconds=5))
    finally:
        database.dispose()
    agent = gauges.agents["bankingAgent"]
    assert agent.turns == {"pending": 1}
    assert (agent.queued, agent.oldest_queued) == (0, None)


async def test_the_collector_renders_zeros_for_known_agents_and_survives_a_lost_database(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Agents with nothing in flight read 0, not absent; a database that cannot be opened
    reads turnstile_database_up 0 and no gauges, never an error."""
    async with sql_store("sqlite") as store:
        database = MonitoringDatabase(store.db.url)
        metrics = Metrics(database=database, agents=["bankingAgent", "idleAgent"])
        text = generate_latest(metrics.registry).decode()
        database.dispose()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples[("turnstile_database_up", ())] == 1
    assert samples[("turnstile_approvals_open", (("agent", "idleAgent"),))] == 0
    assert samples[("turnstile_turns", (("agent", "idleAgent"), ("status", "aborting")))] == 0

    missing = tmp_path_factory.mktemp("gone") / "no-such-dir" / "db.sqlite"
    lost = MonitoringDatabase(f"sqlite:///{missing}", timeout=0.5)
    text = generate_latest(Metrics(database=lost, agents=["bankingAgent"]).registry).decode()
    lost.dispose()
    assert "turnstile_database_up 0.0" in text
    assert "turnstile_approvals_open" not in text


async def test_the_queue_depth_is_also_counted_by_version(store: SqlSessionStore) -> None:
    """Queued turns of two application versions are two series of
    turnstile_queue_depth_by_version, so a version no worker serves stands out."""
    for version, said in (("v1", "hello"), ("v2", "hi"), ("v2", "hey")):
        app = build(store=store, execution="workers", state_keys=TEST_STATE_KEYS)
        app.banking_agent.declared_version = version
        await app.banking_agent.chat().send(said, wait=False)
    database = MonitoringDatabase(store.db.url)
    try:
        gauges = database.read_gauges(datetime.now(UTC) + timedelta(seconds=1))
        scraped = generate_latest(Metrics(database=database, agents=["bankingAgent"]).registry)
    finally:
        database.dispose()
    agent = gauges.agents["bankingAgent"]
    assert agent.queued == 3
    assert agent.queued_by_version == {"v1": 1, "v2": 2}
    samples = {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(scraped.decode())
        for sample in family.samples
        if sample.name == "turnstile_queue_depth_by_version"
    }
    assert samples[(("agent", "bankingAgent"), ("version", "v2"))] == 2
