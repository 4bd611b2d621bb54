"""Interrupts: pausing a turn, answering with respond/restart, re-pausing, refs."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from engine import Engine, FinishReason, ToolContext, TurnStatus
from engine.conversation.parts import INTERRUPT, PENDING_OUTPUT, RESOLVED_INTERRUPT, SOURCE
from examples.banking import ApprovalRequest, BankingApp
from stores import InMemorySessionStore
from tests.support import ListModel, ask, request_in, response_in, say


@pytest.mark.behaviour
async def test_send_pauses_at_the_approval_interrupt(app: BankingApp) -> None:
    """A transfer request pauses the turn: completed/interrupted with one typed interrupt."""
    chat = app.banking_agent.chat()
    res = await chat.send("Transfer $500 to my savings account.")
    assert res.status is TurnStatus.COMPLETED
    assert res.finish_reason is FinishReason.INTERRUPTED
    assert [(i.name, i.ref) for i in res.interrupts] == [("userApproval", "approval-1")]
    assert res.interrupts[0].input == ApprovalRequest(
        action="transferMoney", details="Transfer $500 to my savings account"
    )
    assert res.message is not None and res.message.role == "model"
    assert res.message.content[0].metadata == {INTERRUPT: True}
    assert app.transfers == []


@pytest.mark.behaviour
async def test_respond_answers_without_running_the_interrupt(app: BankingApp) -> None:
    """respond supplies the output; the approved transfer then runs once and the model confirms."""
    chat = app.banking_agent.chat()
    res = await chat.send("Transfer $500 to my savings account.")
    approval = res.interrupts[0]
    res = await chat.resume(respond=[approval.respond({"approved": True, "feedback": "ok"})])
    assert res.finish_reason is FinishReason.STOP
    assert res.text == "Done. Transaction txn-500-my-savings-account."
    assert res.interrupts == []
    assert [t.toAccount for _, t in app.transfers] == ["my savings account"]
    roles = [m.role for m in res.messages]
    assert roles == ["user", "model", "tool", "model", "tool", "model"]
    paused = res.messages[1].content[0]
    assert paused.metadata == {RESOLVED_INTERRUPT: True}


@pytest.mark.behaviour
async def test_denial_cancels_and_runs_nothing(app: BankingApp) -> None:
    """A denied approval makes the model cancel; no transfer is executed."""
    chat = app.banking_agent.chat()
    res = await chat.send("Transfer $500 to my savings account.")
    res = await chat.resume(
        respond=[res.interrupts[0].respond({"approved": False, "feedback": "Not now"})]
    )
    assert res.text == "Transfer cancelled: Not now"
    assert app.transfers == []


@pytest.mark.behaviour
async def test_several_interrupts_answered_in_one_resume(app: BankingApp) -> None:
    """Two approvals surface together and one resume answering both runs both transfers."""
    chat = app.banking_agent.chat()
    res = await chat.send("Transfer $50 to Alice and $75 to Bob")
    assert [i.ref for i in res.interrupts] == ["approval-1", "approval-2"]
    res = await chat.resume(respond=[i.respond({"approved": True}) for i in res.interrupts])
    assert res.text == "Done. Transaction txn-50-alice. Done. Transaction txn-75-bob."
    assert sorted(t.toAccount for _, t in app.transfers) == ["Alice", "Bob"]


@pytest.mark.behaviour
async def test_finished_sibling_output_is_kept_and_replayed_not_rerun(app: BankingApp) -> None:
    """A tool that finished in a round that paused is kept as pendingOutput and replayed once."""
    chat = app.banking_agent.chat()
    res = await chat.send("parallel transfer $20 to Carol")
    assert [i.name for i in res.interrupts] == ["userApproval"]
    assert len(app.transfers) == 1
    assert res.message is not None
    sibling = next(p for p in res.message.content if request_in(p).name == "transferMoney")
    assert sibling.metadata == {PENDING_OUTPUT: {"success": True, "transactionId": "txn-20-carol"}}
    res = await chat.resume(respond=[res.interrupts[0].respond({"approved": False})])
    assert len(app.transfers) == 1, "the finished sibling must not run again"
    tool_message = res.messages[2]
    replayed = next(p for p in tool_message.content if response_in(p).name == "transferMoney")
    assert replayed.metadata == {SOURCE: "pending"}
    assert response_in(replayed).output == {"success": True, "transactionId": "txn-20-carol"}
    amended = next(p for p in res.messages[1].content if request_in(p).name == "transferMoney")
    assert PENDING_OUTPUT not in (amended.metadata or {})


async def test_non_interrupt_tools_of_one_round_run_concurrently() -> None:
    """Tools requested in one round run at the same time (each waits for the other to start)."""
    started = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def meet(name: str, other: str) -> dict[str, str]:
        started[name].set()
        await asyncio.wait_for(started[other].wait(), timeout=2)
        return {"tool": name}

    model = ListModel([ask(("a", "r1", {}), ("b", "r2", {})), say("both ran")])
    ai = Engine(model=model, state_keys={"k": "secret-secret-secret"})

    async def tool_a(_: object) -> dict[str, str]:
        return await meet("a", "b")

    async def tool_b(_: object) -> dict[str, str]:
        return await meet("b", "a")

    agent = ai.define_agent(
        name="pair",
        tools=[ai.define_tool(name="a", fn=tool_a), ai.define_tool(name="b", fn=tool_b)],
        store=InMemorySessionStore(),
    )
    res = await agent.chat().send("go")
    assert res.text == "both ran"
    outputs = [response_in(p).output for p in res.messages[2].content]
    assert outputs == [{"tool": "a"}, {"tool": "b"}]


class Gate(BaseModel):
    """Input of the gated tool."""

    amount: int


def gated_engine(model: ListModel) -> tuple[Engine, list[object]]:
    """An engine with a tool that pauses itself unless restarted with approval."""
    ai = Engine(model=model, state_keys={"k": "secret-secret-secret"})
    seen: list[object] = []

    def pay(request: Gate, ctx: ToolContext) -> dict[str, object]:
        seen.append(ctx.resumed)
        if request.amount > 100 and not (isinstance(ctx.resumed, dict) and ctx.resumed.get("ok")):
            ctx.interrupt({"reason": "over limit", "amount": request.amount})
        return {"paid": request.amount, "resumed": ctx.resumed}

    ai.define_tool(name="pay", input_schema=Gate, fn=pay)
    return ai, seen


async def test_restart_reruns_the_tool_with_resumed_set() -> None:
    """restart re-runs a self-interrupting tool; the tool sees ctx.resumed and completes."""
    model = ListModel([ask(("pay", "p1", {"amount": 500})), say("paid")])
    ai, seen = gated_engine(model)
    agent = ai.define_agent(name="payer", tools=[ai.tools["pay"]], store=InMemorySessionStore())
    chat = agent.chat()
    res = await chat.send("pay 500")
    assert res.interrupts[0].metadata == {"reason": "over limit", "amount": 500}
    res = await chat.resume(restart=[res.interrupts[0].restart(resumed_metadata={"ok": True})])
    assert res.text == "paid"
    assert seen == [None, {"ok": True}]
    assert response_in(res.messages[2].content[0]).output == {"paid": 500, "resumed": {"ok": True}}


async def test_restart_without_metadata_sets_resumed_true() -> None:
    """A bare restart() sets ctx.resumed to True (unlike Genkit JS, which sets nothing)."""
    model = ListModel([ask(("pay", "p1", {"amount": 5})), say("x")])
    ai, seen = gated_engine(model)

    def always_pause(request: Gate, ctx: ToolContext) -> dict[str, object]:
        seen.append(ctx.resumed)
        if ctx.resumed is None:
            ctx.interrupt()
        return {"ok": True}

    tool = ai.define_tool(name="confirm", input_schema=Gate, fn=always_pause)
    model.answers[0] = ask(("confirm", "c1", {"amount": 5}))
    agent = ai.define_agent(name="confirmer", tools=[tool], store=InMemorySessionStore())
    chat = agent.chat()
    res = await chat.send("go")
    assert res.interrupts[0].metadata is True
    res = await chat.resume(restart=[res.interrupts[0].restart()])
    assert seen == [None, True]
    assert res.text == "x"


async def test_restart_that_pauses_again_repauses_the_turn() -> None:
    """A restarted call that interrupts again pauses the resumed turn; a later resume finishes."""
    model = ListModel([ask(("pay", "p1", {"amount": 500})), say("paid")])
    ai, seen = gated_engine(model)
    agent = ai.define_agent(name="payer", tools=[ai.tools["pay"]], store=InMemorySessionStore())
    chat = agent.chat()
    res = await chat.send("pay 500")
    res = await chat.resume(restart=[res.interrupts[0].restart(resumed_metadata={"ok": False})])
    assert res.finish_reason is FinishReason.INTERRUPTED
    assert [i.ref for i in res.interrupts] == ["p1"]
    res = await chat.resume(restart=[res.interrupts[0].restart(resumed_metadata={"ok": True})])
    assert res.text == "paid"
    assert seen == [None, {"ok": False}, {"ok": True}]


async def test_respond_and_restart_mixed_in_one_resume() -> None:
    """One resume may respond to one interrupt and restart another."""
    model = ListModel(
        [
            ask(("pay", "p1", {"amount": 500}), ("ask", "q1", {"question": "why?"})),
            say("done"),
        ]
    )
    ai, _ = gated_engine(model)
    question = ai.define_interrupt(name="ask")
    agent = ai.define_agent(
        name="mixed", tools=[ai.tools["pay"], question], store=InMemorySessionStore()
    )
    chat = agent.chat()
    res = await chat.send("go")
    by_name = {i.name: i for i in res.interrupts}
    res = await chat.resume(
        respond=[by_name["ask"].respond("because")],
        restart=[by_name["pay"].restart(resumed_metadata={"ok": True})],
    )
    assert res.text == "done"
    outputs = {response_in(p).name: response_in(p).output for p in res.messages[2].content}
    assert outputs == {"pay": {"paid": 500, "resumed": {"ok": True}}, "ask": "because"}


async def test_resumed_turn_can_pause_again_until_no_interrupts_remain() -> None:
    """After a resume the model may ask again; the caller loops until interrupts is empty."""
    model = ListModel(
        [
            ask(("approve", "a1", {"step": 1})),
            ask(("approve", "a2", {"step": 2})),
            say("all approved"),
        ]
    )
    ai = Engine(model=model, state_keys={"k": "secret-secret-secret"})
    agent = ai.define_agent(
        name="twice", tools=[ai.define_interrupt(name="approve")], store=InMemorySessionStore()
    )
    chat = agent.chat()
    res = await chat.send("go")
    rounds = 0
    while res.interrupts:
        rounds += 1
        res = await chat.resume(respond=[i.respond(True) for i in res.interrupts])
    assert rounds == 2
    assert res.text == "all approved"


async def test_refs_are_assigned_and_unique_within_a_session() -> None:
    """Requests without a ref get one, and a ref the model reuses later is renamed."""
    model = ListModel(
        [
            ask(("echo", None, {"n": 1}), ("echo", None, {"n": 2})),
            ask(("echo", "x", {"n": 3})),
            ask(("echo", "x", {"n": 4})),
            say("end"),
        ]
    )
    ai = Engine(model=model, state_keys={"k": "secret-secret-secret"})
    agent = ai.define_agent(
        name="refs",
        tools=[ai.define_tool(name="echo", fn=lambda i: i)],
        store=InMemorySessionStore(),
    )
    res = await agent.chat().send("go")
    refs = [
        p.tool_request.ref for m in res.messages for p in m.content if p.tool_request is not None
    ]
    assert all(refs) and len(set(refs)) == len(refs) == 4
    assert refs[2] == "x" and refs[3] is not None and refs[3].startswith("x~")
    responses = [
        p.tool_response.ref for m in res.messages for p in m.content if p.tool_response is not None
    ]
    assert responses == refs


@pytest.mark.behaviour
async def test_a_second_transfer_in_the_same_session_gets_a_fresh_ref(app: BankingApp) -> None:
    """The scripted model reuses approval-1; the engine renames it so both stay answerable."""
    chat = app.banking_agent.chat()
    res = await chat.send("Transfer $1 to A")
    res = await chat.resume(respond=[res.interrupts[0].respond({"approved": True})])
    res = await chat.send("Transfer $2 to B")
    assert res.interrupts[0].ref not in (None, "approval-1")
    assert res.interrupts[0].ref.startswith("approval-1")
    res = await chat.resume(respond=[res.interrupts[0].respond({"approved": True})])
    assert res.text == "Done. Transaction txn-2-b."
    keys = [key for key, _ in app.transfers]
    assert len(set(keys)) == 2


@pytest.mark.parametrize("max_turns", [1, 5])
async def test_max_turns_bounds_tool_rounds(max_turns: int) -> None:
    """A model that keeps calling tools fails after max_turns rounds with Genkit's message."""
    from engine import TurnFailedError
    from examples.banking import build

    app = build(state_keys={"k": "secret-secret-secret"})
    agent = app.ai.define_agent(
        name=f"looper{max_turns}",
        tools=[app.transfer_money],
        store=InMemorySessionStore(),
        max_turns=max_turns,
    )
    with pytest.raises(TurnFailedError) as failed:
        await agent.chat().send("loop forever")
    assert failed.value.status == "ABORTED"
    assert failed.value.message == f"Exceeded maximum tool call iterations ({max_turns})"
    assert len(app.transfers) == max_turns
    snapshot = await agent.get_snapshot(snapshot_id=failed.value.snapshot_id)
    assert snapshot is not None and snapshot.status is TurnStatus.FAILED
    last = snapshot.state.messages[-1]
    assert last.role == "tool", "a failed turn never ends on a dangling tool request"
    assert len(snapshot.state.messages) == 1 + 2 * max_turns
