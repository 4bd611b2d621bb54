"""A retry of a failed or aborted turn continues from its journal, as crash recovery does:
the model is not asked again for a round whose tool calls started, and a started call keeps
its idempotency key (or, not idempotent, becomes the in-doubt interrupt).

Each test runs on the in-memory store, SQLite and PostgreSQL, with turns run in the test's
process; the transfer books into the example's idempotent ledger under its key.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine import AgentResponse, TurnStatus
from engine.store import SessionStore, ToolCallStatus
from examples.banking import BankingApp, build, read_ledger
from tests.conftest import TEST_STATE_KEYS

TRANSFER_SECONDS = 0.5


def slow_bank(store: SessionStore, ledger: Path) -> BankingApp:
    """The banking example whose transfer takes a while (and books into ``ledger``)."""
    return build(
        store=store,
        execution="inline",
        state_keys=TEST_STATE_KEYS,
        ledger=ledger,
        transfer_seconds=TRANSFER_SECONDS,
    )


async def abort_mid_transfer(app: BankingApp) -> tuple[AgentResponse, str]:
    """Pause at the approval, approve it, abort while the transfer runs; the aborted
    response and the chat's session id."""
    chat = app.banking_agent.chat()
    paused = await chat.send("Transfer $500 to savings.")
    approval = paused.interrupts[0]
    resume = asyncio.create_task(chat.resume(respond=[approval.respond({"approved": True})]))
    for _ in range(200):
        if app.transfers:
            break
        await asyncio.sleep(0.01)
    assert app.transfers, "the transfer never started"
    assert await chat.abort() is TurnStatus.PENDING
    aborted = await resume
    assert aborted.status is TurnStatus.ABORTED
    assert chat.session_id is not None
    return aborted, chat.session_id


async def test_a_retry_after_an_abort_mid_transfer_books_nothing_twice(
    store: SessionStore, tmp_path: Path
) -> None:
    """send() on a turn aborted while its transfer ran re-runs that same call under its
    key instead of asking the model for a new one: one booking in the ledger."""
    ledger = tmp_path / "ledger.jsonl"
    app = slow_bank(store, ledger)
    aborted, session_id = await abort_mid_transfer(app)
    first_key = app.transfers[0][0]

    retried = await app.banking_agent.chat(snapshot_id=aborted.snapshot_id).send()

    assert retried.status is TurnStatus.COMPLETED
    assert retried.text == "Done. Transaction txn-500-savings."
    assert {key for key, _ in app.transfers} == {first_key}
    assert [entry["key"] for entry in read_ledger(ledger)] == [first_key]
    assert retried.session_id == session_id
    requests = [
        p.tool_request.name
        for m in retried.messages
        if m.role == "model"
        for p in m.content
        if p.tool_request is not None
    ]
    assert requests == ["userApproval", "transferMoney"], "the model was asked again"


async def test_a_retry_of_an_unfinished_non_idempotent_call_asks_a_human(
    store: SessionStore, tmp_path: Path
) -> None:
    """A non-idempotent transfer that started and never finished is not re-run by a retry:
    the retry pauses at the in-doubt interrupt, keeping the call's key."""
    app = slow_bank(store, tmp_path / "ledger.jsonl")
    app.transfer_money.idempotent = False
    aborted, _ = await abort_mid_transfer(app)
    first_key = app.transfers[0][0]

    retried = await app.banking_agent.chat(snapshot_id=aborted.snapshot_id).send()

    assert retried.finish_reason is not None and retried.finish_reason.value == "interrupted"
    (doubt,) = retried.interrupts
    assert doubt.name == "transferMoney"
    assert doubt.metadata is not None and doubt.metadata.get("unfinished") is True
    assert len(app.transfers) == 1
    assert retried.snapshot_id is not None
    calls = await store.list_calls(retried.snapshot_id)
    assert [(c.name, c.status, c.idempotency_key) for c in calls] == [
        ("transferMoney", ToolCallStatus.INTERRUPTED, first_key)
    ]
