"""The operator views, read through the store, on both databases; open approvals through
the inbox's read (the ``open_approvals`` view itself is SQL for operators: see
test_schema_docs)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engine.store import ApprovalQuery
from examples.banking import build
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_views_show_the_paused_approval_and_the_timeline(kind: str) -> None:
    """A paused transfer is an open approval until approved; the timeline then tells it all."""
    async with sql_store(kind) as store:
        app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
        chat = app.banking_agent.chat()
        paused = await chat.send("Transfer $500 to my savings account.")
        [row] = await store.list_approvals(ApprovalQuery())
        assert (row.turn_id, row.agent, row.interrupt, row.ref) == (
            paused.snapshot_id,
            "bankingAgent",
            "userApproval",
            "approval-1",
        )
        assert row.input == {
            "action": "transferMoney",
            "details": "Transfer $500 to my savings account",
        }
        assert row.created_at <= datetime.now(UTC)
        assert await store.list_approvals(ApprovalQuery(agents=("someoneElse",))) == []
        done = await chat.resume(respond=[paused.interrupts[0].respond({"approved": True})])
        assert await store.list_approvals(ApprovalQuery()) == []
        assert await store.stuck_turns() == []
        entries = await store.timeline(str(done.snapshot_id))
        kinds = [e.kind for e in entries]
        assert kinds[0] == "status" and "tool done" in kinds
        assert entries[-1].detail.startswith("pending -> completed")
        assert [e.at for e in entries] == sorted(e.at for e in entries)
