"""Recovery from the journal: a turn whose runner died continues where it stopped.

The crash here is the runner's task being cancelled with its lease left to expire (the
durable tier repeats these scenarios with SIGKILLed worker processes).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engine import Engine, FinishReason, Message, ToolContext, TurnStatus
from engine.store import NewTurn, ToolCallStatus, TurnInput
from engine.turns.executor import LeaseSettings, execute_claimed, run_inline
from stores import InMemorySessionStore
from tests.support import ListModel, ask, say

SHORT_LEASE = 0.15


class Harness:
    """An agent over an in-memory store, with tools that count executions."""

    def __init__(self, model: ListModel, *, idempotent: bool = True) -> None:
        self.store = InMemorySessionStore()
        self.ai = Engine(model=model, state_keys={"k": "secret-secret-secret"})
        self.model = model
        self.runs: dict[str, list[str]] = {"fast": [], "slow": []}
        self.slow_started = asyncio.Event()
        self.release_slow = asyncio.Event()

        def fast(_: Any, ctx: ToolContext) -> dict[str, str]:
            self.runs["fast"].append(ctx.idempotency_key)
            return {"fast": "done"}

        async def slow(_: Any, ctx: ToolContext) -> dict[str, str]:
            self.runs["slow"].append(ctx.idempotency_key)
            self.slow_started.set()
            await self.release_slow.wait()
            return {"slow": "done"}

        tools = [
            self.ai.define_tool(name="fast", fn=fast),
            self.ai.define_tool(name="slow", fn=slow, idempotent=idempotent),
        ]
        self.agent = self.ai.define_agent(name="worker", tools=tools, store=self.store)

    async def start(self) -> str:
        message = Message.user("go")
        await self.store.create_turn(
            NewTurn(
                id="turn-1",
                session_id="session-1",
                agent="worker",
                input=TurnInput(kind="message", message=message),
                initial_messages=[message],
            )
        )
        return "turn-1"

    async def crash_while(self, event: asyncio.Event) -> None:
        """Run the turn as worker w1 and kill it once ``event`` fires; its lease then expires."""
        claimed = await self.store.claim_turn("turn-1", owner="w1", lease_seconds=SHORT_LEASE)
        task = asyncio.create_task(
            execute_claimed(
                self.agent.runner_config(),
                self.store,
                claimed,
                lease=LeaseSettings(lease_seconds=SHORT_LEASE, heartbeat_interval=60),
            )
        )
        await asyncio.wait_for(event.wait(), timeout=2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(SHORT_LEASE + 0.05)

    def run_as_w1(self, claimed: Any, *, heartbeat_interval: float) -> asyncio.Task[Any]:
        """Run the claimed turn in a task, as worker w1 with the short lease."""
        lease = LeaseSettings(lease_seconds=SHORT_LEASE, heartbeat_interval=heartbeat_interval)
        return asyncio.create_task(
            execute_claimed(self.agent.runner_config(), self.store, claimed, lease=lease)
        )

    async def recover(self) -> Any:
        """A second worker claims the expired turn and runs it to the end."""
        self.release_slow.set()
        return await run_inline(
            self.agent.runner_config(),
            self.store,
            "turn-1",
            owner="w2",
            lease=LeaseSettings(lease_seconds=5, heartbeat_interval=1),
        )


async def test_crash_mid_tool_call_reruns_only_the_unfinished_call() -> None:
    """Finished siblings are not repeated; the unfinished call reruns with the same key."""
    h = Harness(ListModel([ask(("fast", "f1", {}), ("slow", "s1", {})), say("finished")]))
    await h.start()
    await h.crash_while(h.slow_started)
    calls = {c.ref: c for c in await h.store.list_calls("turn-1")}
    assert calls["f1"].status is ToolCallStatus.DONE
    assert calls["s1"].status is ToolCallStatus.RUNNING
    settled = await h.recover()
    assert settled.status is TurnStatus.COMPLETED
    assert len(h.runs["fast"]) == 1, "a finished call must not run twice"
    assert len(h.runs["slow"]) == 2 and len(set(h.runs["slow"])) == 1
    assert len(h.model.requests) == 2, "the model is not asked again for a started round"
    assert settled.attempts == 2
    conversation = await h.store.load_conversation("turn-1")
    assert [m.role for m in conversation] == ["user", "model", "tool", "model"]


async def test_non_idempotent_call_left_unfinished_asks_a_human() -> None:
    """A non-idempotent call cut short pauses the turn instead of running again blindly."""
    h = Harness(
        ListModel([ask(("fast", "f1", {}), ("slow", "s1", {})), say("finished")]),
        idempotent=False,
    )
    await h.start()
    await h.crash_while(h.slow_started)
    settled = await h.recover()
    assert settled.status is TurnStatus.COMPLETED
    assert settled.finish_reason is FinishReason.INTERRUPTED
    assert len(h.runs["slow"]) == 1
    response = await h.agent.respond_for(h.store, settled)
    assert [(i.name, i.ref) for i in response.interrupts] == [("slow", "s1")]
    assert response.interrupts[0].metadata["unfinished"] is True
    chat = h.agent.chat(snapshot_id="turn-1")
    res = await chat.resume(respond=[response.interrupts[0].respond({"slow": "it did happen"})])
    assert res.text == "finished"
    assert len(h.runs["slow"]) == 1 and len(h.runs["fast"]) == 1


async def test_crash_between_rounds_does_not_repeat_the_closed_round() -> None:
    """A crash after a round closed resumes at the next model call."""
    model = ListModel([ask(("fast", "f1", {})), say("second round")])
    h = Harness(model)
    second_call = asyncio.Event()
    original = model.generate

    async def generate(request: Any, on_chunk: Any = None) -> Any:
        if len(model.requests) == 1:
            second_call.set()
            await asyncio.Event().wait()  # hang until the crash
        return await original(request, on_chunk)

    model.generate = generate  # type: ignore[method-assign]
    await h.start()
    await h.crash_while(second_call)
    rounds = await h.store.load_rounds("turn-1")
    assert [(r.round, r.committed) for r in rounds] == [(0, True), (1, True)]
    model.generate = original  # type: ignore[method-assign]
    settled = await h.recover()
    assert settled.status is TurnStatus.COMPLETED
    assert len(h.runs["fast"]) == 1
    conversation = await h.store.load_conversation("turn-1")
    assert conversation[-1].text == "second round"


async def test_a_worker_that_lost_its_lease_stops_and_writes_nothing() -> None:
    """When another worker took the turn over, the old runner's heartbeat stops it unwritten."""
    h = Harness(ListModel([ask(("slow", "s1", {})), say("finished")]))
    await h.start()
    claimed = await h.store.claim_turn("turn-1", owner="w1", lease_seconds=SHORT_LEASE)
    zombie = h.run_as_w1(claimed, heartbeat_interval=SHORT_LEASE * 2)
    await asyncio.wait_for(h.slow_started.wait(), timeout=2)
    await asyncio.sleep(SHORT_LEASE + 0.02)
    taken = await h.store.claim_turn("turn-1", owner="w2", lease_seconds=5)
    outcome = await asyncio.wait_for(zombie, timeout=2)
    assert outcome.lease_token == taken.turn.lease_token and outcome.lease_owner == "w2"
    assert outcome.status is TurnStatus.PENDING
    calls = await h.store.list_calls("turn-1")
    assert [c.status for c in calls] == [ToolCallStatus.RUNNING]


async def test_a_refused_fenced_write_stops_the_runner_without_failing_the_turn() -> None:
    """If another worker took the turn mid-call, the old runner's next write is refused and it
    stops, leaving the turn to its new holder rather than marking it failed."""
    h = Harness(ListModel([ask(("slow", "s1", {})), say("finished")]))
    await h.start()
    claimed = await h.store.claim_turn("turn-1", owner="w1", lease_seconds=SHORT_LEASE)
    old = asyncio.create_task(
        execute_claimed(
            h.agent.runner_config(),
            h.store,
            claimed,
            lease=LeaseSettings(lease_seconds=SHORT_LEASE, heartbeat_interval=60),
        )
    )
    await asyncio.wait_for(h.slow_started.wait(), timeout=2)
    await asyncio.sleep(SHORT_LEASE + 0.02)
    taken = await h.store.claim_turn("turn-1", owner="w2", lease_seconds=5)
    h.release_slow.set()  # the old runner's tool returns and tries to journal its output
    outcome = await asyncio.wait_for(old, timeout=2)
    assert outcome.status is TurnStatus.PENDING and outcome.lease_owner == "w2"
    assert outcome.lease_token == taken.turn.lease_token and outcome.error is None
    [call] = await h.store.list_calls("turn-1")
    assert call.status is ToolCallStatus.RUNNING, "the refused write left the journal untouched"


async def test_a_turn_longer_than_its_lease_keeps_it_by_renewing() -> None:
    """A runner whose tool outlasts the lease renews it every heartbeat: nobody else can
    claim the turn meanwhile, and it settles in its first attempt."""
    h = Harness(ListModel([ask(("slow", "s1", {})), say("finished")]))
    await h.start()
    claimed = await h.store.claim_turn("turn-1", owner="w1", lease_seconds=SHORT_LEASE)
    running = h.run_as_w1(claimed, heartbeat_interval=SHORT_LEASE / 3)
    await asyncio.wait_for(h.slow_started.wait(), timeout=2)
    await asyncio.sleep(SHORT_LEASE * 3)  # three leases' worth: only renewals keep it

    stolen = await h.store.claim_next(owner="w2", lease_seconds=SHORT_LEASE, agents=["worker"])
    h.release_slow.set()
    settled = await running

    assert stolen == []
    assert settled.status is TurnStatus.COMPLETED and settled.attempts == 1
