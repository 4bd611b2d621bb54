"""The worker pool, in process, over the in-memory store: claiming, concurrency, shutdown,
abort and approval expiry.

Agents here use ``execution="workers"``: a send only queues its turn, and nothing runs it but
a :class:`~workers.WorkerPool` (the SQL tiers repeat this with real worker processes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypedDict

import pytest

from engine import Agent, Engine, Message, ScriptedModel, ToolContext, TurnFailedError, TurnStatus
from engine.model import ChunkSink, ModelRequest, ModelResponse
from engine.store import ToolCallStatus
from examples.banking import SYSTEM_PROMPT, ApprovalDecision, ApprovalRequest, BankingApp
from stores import InMemorySessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import events_of
from tests.support import ListModel, ask, say
from workers import WorkerPool


class PoolOptions(TypedDict):
    """WorkerPool keyword arguments (typed, so ``**FAST`` is checked against its signature)."""

    poll_interval: float
    scheduler: bool


FAST: PoolOptions = {"poll_interval": 0.05, "scheduler": False}


class ProbeModel:
    """Asks for the ``probe`` tool once per turn, then answers ``done``."""

    name = "probe-model"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        last = request.messages[-1]
        reply = say("done") if last.role == "tool" else ask(("probe", "p", {}))
        return ModelResponse(message=reply)


def queued_agent(ai: Engine, store: InMemorySessionStore, tools: list[Any]) -> Agent:
    """An agent whose turns only a worker pool runs."""
    return ai.define_agent(name="queued", tools=tools, store=store, execution="workers")


async def eventually(check: Callable[[], Any], within: float = 2.0) -> Any:
    """Poll an async ``check`` until it returns something truthy (at most ``within`` s)."""
    async with asyncio.timeout(within):
        while True:
            if result := await check():
                return result
            await asyncio.sleep(0.01)


async def test_queued_banking_flow_runs_in_the_pool_and_transfers_once(app: BankingApp) -> None:
    """A queued send pauses for approval and the approved resume transfers exactly once, both
    turns run by the pool."""
    agent = app.ai.define_agent(
        name="queuedBanking",
        system=SYSTEM_PROMPT,
        tools=[app.user_approval, app.transfer_money],
        store=app.banking_agent.store,
        execution="workers",
    )
    async with WorkerPool(app.ai, **FAST) as pool:
        assert pool.agents == {"queuedBanking": agent}, "inline agents are not served"
        chat = agent.chat()
        paused = await chat.send("Transfer $500 to my savings account.")
        assert paused.finish_reason == "interrupted"
        approval = next(i for i in paused.interrupts if i.name == "userApproval")
        assert isinstance(approval.input, ApprovalRequest)
        done = await chat.resume(respond=[approval.respond({"approved": True})])
    assert done.text == "Done. Transaction txn-500-my-savings-account."
    assert [request.toAccount for _, request in app.transfers] == ["my savings account"]
    assert (pool.claimed_total, pool.settled_total) == (2, 2)


async def test_fifty_sessions_on_two_pools_each_settle_exactly_once() -> None:
    """Fifty queued turns shared by two competing pools are each claimed and settled once."""
    store = InMemorySessionStore()
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    agent = queued_agent(ai, store, [])
    sent = [await agent.chat().send(f"hello {n}", wait=False) for n in range(50)]
    ids = [res.snapshot_id for res in sent]
    assert all(res.status is TurnStatus.PENDING for res in sent)
    async with (
        WorkerPool(ai, store, concurrency=4, **FAST) as one,
        WorkerPool(ai, store, concurrency=4, **FAST) as two,
    ):
        answers = [await agent.wait(str(turn_id), timeout=5) for turn_id in ids]
    assert [a.text for a in answers] == [f"Echo: hello {n}" for n in range(50)]
    assert one.claimed_total + two.claimed_total == 50
    assert one.settled_total + two.settled_total == 50
    for turn_id in ids:
        events = await events_of(store, str(turn_id))
        assert [e.to_status for e in events] == [TurnStatus.PENDING, TurnStatus.COMPLETED]
        assert events[-1].attempt == 1


async def test_pool_never_runs_more_turns_than_its_concurrency() -> None:
    """With concurrency 3 and twelve queued turns, at most three tool calls overlap (and three
    do)."""
    store = InMemorySessionStore()
    ai = Engine(model=ProbeModel(), state_keys=TEST_STATE_KEYS)
    active, peak = 0, 0

    async def probe(_: Any) -> dict[str, bool]:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.03)
        active -= 1
        return {"ok": True}

    agent = queued_agent(ai, store, [ai.define_tool(name="probe", fn=probe)])
    ids = [(await agent.chat().send("go", wait=False)).snapshot_id for _ in range(12)]
    async with WorkerPool(ai, store, concurrency=3, **FAST) as pool:
        for turn_id in ids:
            assert (await agent.wait(str(turn_id), timeout=5)).text == "done"
            assert len(pool.running) <= 3
    assert peak == 3
    assert pool.settled_total == 12


async def test_stop_hands_a_running_turn_back_and_another_pool_finishes_it() -> None:
    """A turn still running after the grace period is handed back pending with its lease
    released, and a second pool re-runs only the unfinished call, under the same key."""
    store = InMemorySessionStore()
    ai = Engine(model=ListModel([ask(("slow", "s1", {})), say("finished")]))
    keys: list[str] = []
    started = asyncio.Event()

    async def slow(_: Any, ctx: ToolContext) -> dict[str, bool]:
        keys.append(ctx.idempotency_key)
        if len(keys) == 1:
            started.set()
            await asyncio.Event().wait()  # the first run never finishes by itself
        return {"slow": True}

    agent = queued_agent(ai, store, [ai.define_tool(name="slow", fn=slow)])
    turn_id = str((await agent.chat().send("go", wait=False)).snapshot_id)
    first = WorkerPool(ai, store, shutdown_grace=0.1, **FAST)
    async with first:
        await asyncio.wait_for(started.wait(), 2)
        assert first.running == {turn_id}
    turn = await store.get_turn(turn_id)
    assert turn is not None
    assert turn.status is TurnStatus.PENDING
    assert (turn.lease_owner, turn.lease_expires_at) == (None, None), "lease released"
    assert [c.status for c in await store.list_calls(turn_id)] == [ToolCallStatus.RUNNING]
    assert (await events_of(store, turn_id))[-1].note == "worker shutdown"
    assert first.handed_back_total == 1 and first.settled_total == 0
    async with WorkerPool(ai, store, **FAST) as second:
        done = await agent.wait(turn_id, timeout=2)
    assert done.text == "finished"
    assert len(keys) == 2 and keys[0] == keys[1]
    assert second.settled_total == 1


async def test_graceful_stop_lets_a_short_turn_finish() -> None:
    """A turn that settles within the grace period is finished, not handed back."""
    store = InMemorySessionStore()
    ai = Engine(model=ListModel([ask(("quick", "q1", {})), say("finished")]))
    started = asyncio.Event()

    async def quick(_: Any) -> dict[str, bool]:
        started.set()
        await asyncio.sleep(0.1)
        return {"quick": True}

    agent = queued_agent(ai, store, [ai.define_tool(name="quick", fn=quick)])
    turn_id = str((await agent.chat().send("go", wait=False)).snapshot_id)
    async with WorkerPool(ai, store, shutdown_grace=2, **FAST) as pool:
        await asyncio.wait_for(started.wait(), 2)
    turn = await store.get_turn(turn_id)
    assert turn is not None and turn.status is TurnStatus.COMPLETED
    assert (pool.settled_total, pool.handed_back_total) == (1, 0)


async def test_abort_from_outside_stops_a_queued_running_turn() -> None:
    """agent.abort() on a turn a pool is running cancels its tool and settles it aborted."""
    store = InMemorySessionStore()
    ai = Engine(model=ListModel([ask(("hang", "h1", {}))]))
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hang(_: Any) -> dict[str, bool]:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    agent = queued_agent(ai, store, [ai.define_tool(name="hang", fn=hang)])
    turn_id = str((await agent.chat().send("go", wait=False)).snapshot_id)
    async with WorkerPool(ai, store, **FAST) as pool:
        await asyncio.wait_for(started.wait(), 2)
        assert turn_id in ai.local_aborts, "the pool registers the turn's abort signal"
        assert await agent.abort(turn_id) is TurnStatus.PENDING
        res = await agent.wait(turn_id, timeout=2)
    assert res.status is TurnStatus.ABORTED
    assert cancelled.is_set()
    assert turn_id not in ai.local_aborts
    assert pool.settled_total == 1


async def test_abort_through_the_store_alone_stops_a_turn_that_just_started() -> None:
    """An abort requested in the store as another process would (no signal in this one), the
    moment the turn's tool starts, before anything here waits for change notifications:
    the executor's first status read finds it, well before the first heartbeat (5 s)."""
    store = InMemorySessionStore()
    ai = Engine(model=ListModel([ask(("hang", "h1", {}))]))
    started = asyncio.Event()

    async def hang(_: Any) -> dict[str, bool]:
        started.set()
        await asyncio.Event().wait()
        return {}

    agent = queued_agent(ai, store, [ai.define_tool(name="hang", fn=hang)])
    turn_id = str((await agent.chat().send("go", wait=False)).snapshot_id)
    async with WorkerPool(ai, store, **FAST):
        await asyncio.wait_for(started.wait(), 2)
        assert (await store.request_abort(turn_id)).status is TurnStatus.ABORTING
        res = await agent.wait(turn_id, timeout=2)
    assert res.status is TurnStatus.ABORTED


def expiring_app(on_timeout: Any) -> tuple[Engine, Agent, list[str]]:
    """A banking agent whose approval expires after 0.2 s with ``on_timeout``."""
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    transfers: list[str] = []
    approval = ai.define_interrupt(
        name="userApproval",
        input_schema=ApprovalRequest,
        output_schema=ApprovalDecision,
        timeout=0.2,
        on_timeout=on_timeout,
    )

    def transfer(request: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        transfers.append(ctx.idempotency_key)
        return {"success": True, "transactionId": "txn"}

    money = ai.define_tool(name="transferMoney", fn=transfer)
    agent = ai.define_agent(
        name="expiring",
        system=SYSTEM_PROMPT,
        tools=[approval, money],
        store=InMemorySessionStore(),
        execution="workers",
    )
    return ai, agent, transfers


async def next_settled(agent: Agent, session_id: str, after: str) -> str:
    """Wait for a settled snapshot newer than ``after`` in the session; return its id."""

    async def check() -> str | None:
        latest = await agent.get_snapshot(session_id=session_id)
        if latest is None or latest.snapshot_id == after:
            return None
        return latest.snapshot_id if latest.status is not TurnStatus.PENDING else None

    return str(await eventually(check))


async def test_expired_approval_is_answered_with_its_default_by_the_scheduler() -> None:
    """An approval left unanswered past timeout= is resumed with on_timeout's answer by the
    pool's expiry job, recorded as decided by timeout."""
    ai, agent, transfers = expiring_app({"approved": False, "feedback": "expired"})
    async with WorkerPool(ai, expiry_interval=0.05, poll_interval=0.05):
        chat = agent.chat()
        paused = await chat.send("Transfer $500 to my savings account.")
        assert paused.finish_reason == "interrupted"
        assert paused.session_id is not None and paused.snapshot_id is not None
        decided = await next_settled(agent, paused.session_id, paused.snapshot_id)
        res = await agent.wait(decided)
    assert res.text == "Transfer cancelled: expired"
    assert transfers == []
    assert agent.store is not None
    [call] = await agent.store.list_calls(paused.snapshot_id)
    assert (call.status, call.decided_by) == (ToolCallStatus.ANSWERED, "timeout")


async def test_expired_approval_with_on_timeout_fail_fails_the_session() -> None:
    """With on_timeout="fail", the expiry job fails the paused session with
    DEADLINE_EXCEEDED."""
    ai, agent, _ = expiring_app("fail")
    async with WorkerPool(ai, expiry_interval=0.05, poll_interval=0.05):
        paused = await agent.chat().send("Transfer $500 to my savings account.")
        assert paused.session_id is not None and paused.snapshot_id is not None
        decided = await next_settled(agent, paused.session_id, paused.snapshot_id)
        with pytest.raises(TurnFailedError) as failure:
            await agent.wait(decided)
    assert failure.value.status == "DEADLINE_EXCEEDED"
    snapshot = await agent.get_snapshot(session_id=paused.session_id)
    assert snapshot is not None and snapshot.status is TurnStatus.FAILED
    assert snapshot.error is not None and snapshot.error["status"] == "DEADLINE_EXCEEDED"


async def test_send_without_wait_returns_pending_and_wait_returns_the_settled_turn() -> None:
    """send(wait=False) returns a pending snapshot at once, with no pool running, and
    agent.wait() returns its settled response once a pool ran it."""
    store = InMemorySessionStore()
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    agent = queued_agent(ai, store, [])
    queued = await asyncio.wait_for(agent.chat().send("hello", wait=False), 1)
    assert queued.status is TurnStatus.PENDING and queued.snapshot_id is not None
    assert queued.messages == []
    async with WorkerPool(ai, store, **FAST):
        settled = await agent.wait(queued.snapshot_id, timeout=2)
    assert settled.status is TurnStatus.COMPLETED
    assert settled.text == "Echo: hello"
    assert [m.role for m in settled.messages] == ["user", "model"]


async def test_pool_needs_a_queued_agent_and_one_store() -> None:
    """A pool refuses an engine without queued agents, or whose queued agents use several
    stores, unless the store is named."""
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    ai.define_agent(name="inline", store=InMemorySessionStore())
    with pytest.raises(ValueError, match="found none"):
        WorkerPool(ai)
    first, second = InMemorySessionStore(), InMemorySessionStore()
    ai.define_agent(name="a", store=first, execution="workers")
    ai.define_agent(name="b", store=second, execution="workers")
    with pytest.raises(ValueError, match="2 different stores"):
        WorkerPool(ai)
    assert set(WorkerPool(ai, second, scheduler=False).agents) == {"b"}


async def test_a_store_failure_while_claiming_does_not_stop_the_pool() -> None:
    """The pool logs a failing claim, backs off and claims again once the store recovers."""
    store = InMemorySessionStore()
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    agent = queued_agent(ai, store, [])
    real_claim = store.claim_next
    failures = 2

    async def flaky_claim(**kwargs: Any) -> Any:
        nonlocal failures
        if failures:
            failures -= 1
            raise ConnectionError("database restarting")
        return await real_claim(**kwargs)

    store.claim_next = flaky_claim  # type: ignore[method-assign]
    async with WorkerPool(ai, store, **FAST):
        res = await agent.chat().send("hello")
    assert res.text == "Echo: hello"
    assert failures == 0


async def test_run_with_a_stop_event_returns_after_stopping() -> None:
    """run(stop) claims until the event is set and then returns."""
    store = InMemorySessionStore()
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    agent = queued_agent(ai, store, [])
    stop = asyncio.Event()
    pool = WorkerPool(ai, store, poll_interval=0.05, expiry_interval=0.05)
    runner = asyncio.create_task(pool.run(stop))
    assert (await agent.chat().send(Message.user("hi"))).text == "Echo: hi"
    await asyncio.sleep(0.12)
    assert pool.scheduler is not None and pool.scheduler.expiry_runs >= 1
    stop.set()
    await asyncio.wait_for(runner, 1)
    assert pool.stopping and not pool.scheduler.running


async def test_stop_lets_a_running_expiry_job_finish(caplog: pytest.LogCaptureFixture) -> None:
    """Stopping the pool while the expiry job runs waits for that run instead of cancelling
    it."""
    store = InMemorySessionStore()
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    queued_agent(ai, store, [])
    entered = asyncio.Event()
    real_list = store.list_expired_interrupts

    async def slow_list(**kwargs: Any) -> Any:
        entered.set()
        await asyncio.sleep(0.1)
        return await real_list(**kwargs)

    store.list_expired_interrupts = slow_list  # type: ignore[method-assign]
    pool = WorkerPool(ai, store, poll_interval=0.05, expiry_interval=0.05)
    async with pool:
        await asyncio.wait_for(entered.wait(), 2)
    assert pool.scheduler is not None and pool.scheduler.expiry_runs == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_retention_job_prunes_idle_sessions() -> None:
    """With retention set, the pool's scheduler deletes sessions idle longer than it (what is
    kept is the store contract's concern: test_store_inbox_and_retention)."""
    store = InMemorySessionStore()
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    agent = ai.define_agent(name="queued", tools=[], store=store, execution="workers")
    async with WorkerPool(
        ai, poll_interval=0.05, expiry_interval=60, retention=0.2, retention_interval=0.05
    ) as pool:
        done = await agent.chat().send("hello")
        assert await store.get_session(done.session_id) is not None
        assert pool.scheduler is not None
        await eventually(lambda: _gone(store, done.session_id), within=5)
        assert pool.scheduler.pruned_total == 1
    assert await store.get_turn(done.snapshot_id or "") is None


async def _gone(store: InMemorySessionStore, session_id: str) -> bool:
    return await store.get_session(session_id) is None


def test_retention_must_be_positive() -> None:
    """A zero or negative retention is refused when the pool is built."""
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    ai.define_agent(name="queued", tools=[], store=InMemorySessionStore(), execution="workers")
    with pytest.raises(ValueError, match="retention must be positive"):
        WorkerPool(ai, retention=0)
