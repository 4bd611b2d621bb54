"""The engine's instrumentation hook (:mod:`engine.telemetry.instruments`) feeding a process's
Prometheus series (:class:`workers.metrics.EngineMetrics`): model and tool calls, lease
losses on every store, expired approvals, relayed chunks, and removal."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from engine import Engine, Message, ToolContext, TurnFailedError, TurnStatus
from engine.model import ModelRequest, TransientModelError
from engine.store import NewTurn, SessionStore, TurnInput
from engine.telemetry import instruments
from engine.turns.executor import LeaseSettings, execute_claimed
from stores import InMemorySessionStore
from stores.chunk_relay import ChunkBatcher
from tests.conftest import TEST_STATE_KEYS
from tests.integration.test_worker_pool import expiring_app, next_settled
from tests.support import ListModel, ask, say
from workers import WorkerPool
from workers.metrics import Metrics

SHORT_LEASE = 0.2


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    """One sample of ``metrics``' registry (0 when the series does not exist)."""
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def metrics() -> Any:
    """A process's metrics receiving the engine's reports for the test's duration."""
    observed = Metrics(agents=["worker", "expiring"])
    observed.observe_engine()
    yield observed
    observed.close()


async def test_model_and_tool_calls_are_timed_and_their_errors_counted(metrics: Metrics) -> None:
    """Answered calls are timed by name; a failing tool and a transient model failure are
    counted as errors of their kind."""

    def broken(_: Any, ctx: ToolContext) -> dict[str, str]:
        raise ValueError("disk on fire")

    def flaky(_: ModelRequest) -> Message:
        raise TransientModelError("rate limited")

    model = ListModel([ask(("lookup", "l1", {})), say("found"), ask(("broken", "b1", {})), flaky])
    ai = Engine(model=model, state_keys=TEST_STATE_KEYS)
    lookup = ai.define_tool(name="lookup", fn=lambda _, ctx: {"found": True})
    failing = ai.define_tool(name="broken", fn=broken)
    agent = ai.define_agent(
        name="worker", tools=[lookup, failing], store=InMemorySessionStore(), max_attempts=1
    )

    assert (await agent.chat().send("look it up")).text == "found"
    with pytest.raises(TurnFailedError):
        await agent.chat().send("break it")
    with pytest.raises(TurnFailedError):
        await agent.chat().send("rate limit me")

    model_labels = {"agent": "worker", "model": "list"}
    assert sample(metrics, "turnstile_model_call_duration_seconds_count", **model_labels) == 4
    transient = {"kind": "transient", **model_labels}
    assert sample(metrics, "turnstile_model_call_errors_total", **transient) == 1
    for tool in ("lookup", "broken"):
        labels = {"agent": "worker", "tool": tool}
        assert sample(metrics, "turnstile_tool_call_duration_seconds_count", **labels) == 1
    assert sample(metrics, "turnstile_tool_call_errors_total", agent="worker", tool="lookup") == 0
    errors = {"agent": "worker", "tool": "broken", "outcome": "INTERNAL"}
    assert sample(metrics, "turnstile_tool_call_errors_total", **errors) == 1


async def test_a_lost_lease_is_counted_once(store: SessionStore, metrics: Metrics) -> None:
    """A run whose lease expired and was claimed by another worker stops at its next fenced
    write, and the loss is counted for its agent."""
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow(_: Any, ctx: ToolContext) -> dict[str, str]:
        started.set()
        await release.wait()
        return {"slow": "done"}

    ai = Engine(model=ListModel([ask(("slow", "s1", {})), say("done")]))
    agent = ai.define_agent(name="worker", tools=[ai.define_tool(name="slow", fn=slow)])
    message = Message.user("go")
    await store.create_turn(
        NewTurn(
            id="turn-1",
            session_id="session-1",
            agent="worker",
            input=TurnInput(kind="message", message=message),
            initial_messages=[message],
        )
    )
    claimed = await store.claim_turn("turn-1", owner="w1", lease_seconds=SHORT_LEASE)
    # No heartbeat before the lease runs out: the fenced write is what notices the loss.
    lease = LeaseSettings(lease_seconds=SHORT_LEASE, heartbeat_interval=60)
    run = asyncio.create_task(execute_claimed(agent.runner_config(), store, claimed, lease=lease))
    await asyncio.wait_for(started.wait(), timeout=5)
    await asyncio.sleep(SHORT_LEASE + 0.1)
    taken = await store.claim_turn("turn-1", owner="w2", lease_seconds=30)
    release.set()
    settled = await asyncio.wait_for(run, timeout=5)

    assert settled.lease_token == taken.turn.lease_token, "w1 wrote nothing after losing the lease"
    assert settled.status is TurnStatus.PENDING
    assert sample(metrics, "turnstile_lease_losses_total", agent="worker") == 1


async def test_an_expired_approval_is_counted_for_its_agent(metrics: Metrics) -> None:
    """The pool's expiry job deciding an overdue approval counts it once."""
    assert sample(metrics, "turnstile_approvals_expired_total", agent="expiring") == 0
    ai, agent, _ = expiring_app({"approved": False, "feedback": "expired"})
    async with WorkerPool(ai, expiry_interval=0.05, poll_interval=0.05):
        paused = await agent.chat().send("Transfer $500 to my savings account.")
        assert paused.session_id is not None and paused.snapshot_id is not None
        await next_settled(agent, paused.session_id, paused.snapshot_id)
    assert sample(metrics, "turnstile_approvals_expired_total", agent="expiring") == 1


async def test_relayed_chunks_and_their_batches_are_counted(metrics: Metrics) -> None:
    """Chunks flushed together count as one batch; a failed send counts nothing."""
    sent: list[list[str]] = []

    async def send(payloads: list[str]) -> None:
        sent.append(payloads)

    batcher = ChunkBatcher(send, interval=60)
    for word in ("one", "two", "three"):
        await batcher.publish("turn-1", {"modelChunk": {"content": [{"text": word}]}})
    await batcher.flush("turn-1")

    async def refuse(payloads: list[str]) -> None:
        raise ConnectionError("database down")

    failing = ChunkBatcher(refuse, interval=60)
    await failing.publish("turn-2", {"modelChunk": {"content": [{"text": "lost"}]}})
    await failing.flush("turn-2")

    assert len(sent) == 1
    assert sample(metrics, "turnstile_relay_chunks_total") == 3
    assert sample(metrics, "turnstile_relay_batches_total") == 1


def test_closed_or_dropped_metrics_stop_receiving_reports() -> None:
    """close() removes a process's metrics from the registry, and so does dropping them:
    building several in one interpreter leaves no stale instrument behind."""
    before = len(instruments.instruments())
    closed = Metrics()
    closed.observe_engine()
    assert len(instruments.instruments()) == before + 1
    closed.close()
    instruments.lease_lost("worker")
    assert sample(closed, "turnstile_lease_losses_total", agent="worker") == 0
    assert len(instruments.instruments()) == before

    dropped = Metrics()
    dropped.observe_engine()
    assert len(instruments.instruments()) == before + 1
    del dropped
    gc.collect()
    assert len(instruments.instruments()) == before
