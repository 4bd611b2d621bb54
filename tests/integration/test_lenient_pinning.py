"""Lenient pinning, the dev loop's rule, on every store (memory, SQLite, PostgreSQL): a turn
paused under one prompt resumes under an edited prompt, with a warning naming the change,
when the app declares no version or its engine is lenient (``--dev``); under a declared
version without it the resume is refused, and a change to a tool's schema is refused either
way. A worker of the edited app claims the turns the app queued before the edit."""

from __future__ import annotations

import logging

import pytest
from pydantic import BaseModel

from engine import Engine, FinishReason
from engine.approvals.decide import Decision, decide, find_approval
from engine.conversation.parts import Message, Part
from engine.state.versioning import DefinitionChangedError
from engine.status import TurnStatus
from engine.store import SessionStore
from tests.databases import events_of
from tests.integration.store_support import new_turn
from tests.support import ListModel, ask, say
from workers import WorkerPool

PROMPT_A = "You move money."
PROMPT_B = "You move money, and you say so politely."


class Approval(BaseModel):
    approved: bool


class Transfer(BaseModel):
    amount: int


class TransferInCurrency(BaseModel):
    amount: int
    currency: str


def _bank(
    store: SessionStore,
    answers: list[Message],
    *,
    system: str = PROMPT_A,
    version: str | None = None,
    lenient: bool = False,
    transfer_schema: type[BaseModel] = Transfer,
    execution: str = "inline",
) -> Engine:
    """The app whose agent ``bank`` is at one edit of its definition, on ``store``."""
    ai = Engine(model=ListModel(answers), version=version, lenient_pinning=lenient)
    approve = ai.define_interrupt(name="approve", output_schema=Approval)
    move = ai.define_tool(name="transfer", input_schema=transfer_schema, fn=lambda t: {"ok": True})
    ai.define_agent(
        name="bank", system=system, tools=[approve, move], store=store, execution=execution
    )
    return ai


async def _paused_under_prompt_a(store: SessionStore, *, version: str | None = None) -> str:
    """A session paused at ``approve`` under prompt A; the paused snapshot's id."""
    before = _bank(store, [ask(("approve", "a1", {"amount": 5}))], version=version)
    paused = await before.agents["bank"].chat().send("Move 5")
    assert paused.finish_reason is FinishReason.INTERRUPTED
    return str(paused.snapshot_id)


def _approved() -> list[Part]:
    return [Part.of_response("approve", "a1", {"approved": True})]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "turnstile.pinning" and r.levelno == logging.WARNING
    ]


async def test_without_a_declared_version_a_prompt_edit_resumes_with_a_warning(
    store: SessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The app declares no version: the resume after a prompt edit runs under prompt B, keeps
    the tools version, records B's fingerprint, and both the log and the turn's timeline name
    the change."""
    paused = await _paused_under_prompt_a(store)
    edited = _bank(store, [say("Moved, politely.")], system=PROMPT_B).agents["bank"]
    with caplog.at_level(logging.WARNING, logger="turnstile.pinning"):
        done = await edited.chat(snapshot_id=paused).resume(respond=_approved())
    assert done.text == "Moved, politely."
    (warning,) = _warnings(caplog)
    assert paused in warning and "system changed" in warning
    assert "the app declares no version" in warning
    before, after = await store.get_turn(paused), await store.get_turn(str(done.snapshot_id))
    assert before is not None and after is not None
    assert after.app_version == before.app_version == edited.version
    assert after.definition_fingerprint == edited.fingerprint != before.definition_fingerprint
    (note,) = [e.note for e in await events_of(store, after.id) if e.note]
    assert "resumed under a changed definition" in note and "system changed" in note


async def test_under_a_declared_version_a_lenient_engine_resumes_a_prompt_edit(
    store: SessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Version v1 before and after the edit, the edited engine made lenient after its agents
    were defined (as ``--dev`` does): the resume runs, with a warning naming the change."""
    paused = await _paused_under_prompt_a(store, version="v1")
    edited_app = _bank(store, [say("Moved.")], system=PROMPT_B, version="v1")
    edited = edited_app.agents["bank"]
    assert edited.lenient_pinning is False
    edited_app.lenient_pinning = True
    assert edited.lenient_pinning is True
    with caplog.at_level(logging.WARNING, logger="turnstile.pinning"):
        done = await edited.chat(snapshot_id=paused).resume(respond=_approved())
    assert done.text == "Moved."
    (warning,) = _warnings(caplog)
    assert "system changed" in warning and "--dev" in warning
    resumed = await store.get_turn(str(done.snapshot_id))
    assert resumed is not None and resumed.app_version == "v1"


async def test_under_a_declared_version_a_strict_engine_refuses_a_prompt_edit(
    store: SessionStore,
) -> None:
    """Version v1, no lenient pinning: the resume after a prompt edit is refused, naming the
    change and how a lenient engine would take it, and nothing is written."""
    paused = await _paused_under_prompt_a(store, version="v1")
    edited = _bank(store, [say("never")], system=PROMPT_B, version="v1").agents["bank"]
    with pytest.raises(DefinitionChangedError) as refused:
        await edited.chat(snapshot_id=paused).resume(respond=_approved())
    assert "system changed" in refused.value.message
    assert "lenient_pinning=True" in refused.value.message
    turn = await store.get_turn(paused)
    assert turn is not None
    latest = await store.latest_turn(turn.session_id)
    assert latest is not None and latest.id == paused


@pytest.mark.parametrize(
    ("version", "lenient"), [(None, False), ("v1", True)], ids=["no-version", "dev"]
)
async def test_a_tool_schema_change_is_refused_even_when_lenient(
    store: SessionStore, version: str | None, lenient: bool
) -> None:
    """The transfer tool's input schema gained a field: lenient or not, the resume is
    refused naming the schema, and nothing is written."""
    paused = await _paused_under_prompt_a(store, version=version)
    edited = _bank(
        store,
        [say("never")],
        system=PROMPT_B,
        version=version,
        lenient=lenient,
        transfer_schema=TransferInCurrency,
    ).agents["bank"]
    with pytest.raises(DefinitionChangedError) as refused:
        await edited.chat(snapshot_id=paused).resume(respond=_approved())
    assert "tools.transfer.inputSchema changed" in refused.value.message
    assert "lenient_pinning=True" not in refused.value.message
    turn = await store.get_turn(paused)
    assert turn is not None
    latest = await store.latest_turn(turn.session_id)
    assert latest is not None and latest.id == paused


@pytest.mark.parametrize(("lenient", "recorded"), [(True, True), (False, False)])
async def test_the_inbox_decides_a_prompt_edited_approval_only_when_lenient(
    store: SessionStore, lenient: bool, recorded: bool
) -> None:
    """Under a declared version, an inbox decision on an approval paused before a prompt
    edit is recorded and resumed by a lenient engine, and refused before anything is
    recorded by a strict one."""
    paused = await _paused_under_prompt_a(store, version="v1")
    edited_app = _bank(store, [say("Moved.")], system=PROMPT_B, version="v1", lenient=lenient)
    edited = edited_app.agents["bank"]
    found = await find_approval(store, paused, "a1")
    assert found is not None
    approval, _ = found
    if not recorded:
        with pytest.raises(DefinitionChangedError):
            await decide(edited, approval, Decision(respond={"approved": True}), decided_by="bo")
        found_again = await find_approval(store, paused, "a1")
        assert found_again is not None and found_again[1], "the approval stays open"
        return
    outcome = await decide(edited, approval, Decision(respond={"approved": True}), decided_by="bo")
    assert outcome.resume_snapshot_id is not None
    resumed = await store.get_turn(outcome.resume_snapshot_id)
    assert resumed is not None and resumed.status is TurnStatus.COMPLETED


async def test_a_worker_of_the_edited_app_claims_turns_queued_before_the_edit(
    store: SessionStore,
) -> None:
    """No declared version: a resume queued under prompt A (its worker gone) is claimed and
    run by a worker pool of the app edited to prompt B, whose version is the same tools
    version."""
    before = _bank(store, [ask(("approve", "a1", {"amount": 5}))], execution="workers")
    async with WorkerPool(before, store, poll_interval=0.05, scheduler=False):
        paused = await before.agents["bank"].chat().send("Move 5", timeout=10)
    assert paused.finish_reason is FinishReason.INTERRUPTED
    queued = await (
        before.agents["bank"]
        .chat(snapshot_id=str(paused.snapshot_id))
        .resume(respond=_approved(), wait=False)
    )
    edited = _bank(store, [say("Moved by B.")], system=PROMPT_B, execution="workers")
    agent = edited.agents["bank"]
    assert agent.fingerprint != before.agents["bank"].fingerprint
    pool = WorkerPool(edited, store, poll_interval=0.05, scheduler=False)
    async with pool:
        done = await agent.wait(str(queued.snapshot_id), timeout=10)
    assert done.text == "Moved by B."
    assert pool.claimed_total == 1


async def test_a_worker_still_claims_turns_pinned_to_its_fingerprint_as_a_version(
    store: SessionStore,
) -> None:
    """A turn queued before tools versions, by an app without a declared version, carries
    the definition's fingerprint as its version: a worker of that unchanged app claims and
    runs it."""
    app = _bank(store, [say("Ran the old turn.")], execution="workers")
    agent = app.agents["bank"]
    await store.create_turn(
        new_turn(
            "from-before",
            agent="bank",
            app_version=agent.fingerprint,
            definition_fingerprint=agent.fingerprint,
            definition=agent.definition,
        )
    )
    pool = WorkerPool(app, store, poll_interval=0.05, scheduler=False)
    assert agent.version != agent.fingerprint
    assert {agent.version, agent.fingerprint} <= set(pool.versions)
    async with pool:
        done = await agent.wait("from-before", timeout=10)
    assert done.text == "Ran the old turn."
