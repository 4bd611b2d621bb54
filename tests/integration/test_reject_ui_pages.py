"""Reject on the approval page over real HTTP without a browser, on PostgreSQL: the decision
box comes right after what is asked (assignment below it) with Approve, Edit and approve, and
Reject with a reason; a reject without a reason comes back marked (400, nothing recorded); a
reject books nothing and shows "rejected: <reason>" on the page, in the history and the CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from engine.rejection import MAX_REASON_LENGTH
from engine.remote import create_app
from engine.remote.ui import UiSettings
from examples import banking
from examples.banking import BankingApp
from examples.guarded_banking import GuardedApp
from tests.http_support import serve_in_loop
from tests.integration.guarded_support import ask_transfer, csrf_of, served, signed_in

__all__ = ["served"]  # the fixture these tests take

SETTINGS = UiSettings(secret="reject-pages-secret-0123456789abcdef", poll_seconds=1)


async def test_the_decision_box_follows_what_is_asked(served: tuple[GuardedApp, str]) -> None:
    """The guarded tool's page offers Approve, Approve with these arguments and Reject (with a
    required, bounded reason) before the votes and the assignment controls."""
    _app, base = served
    approval = await ask_transfer(base)
    bob = await signed_in(base, "bob")
    try:
        page = (await bob.get(f"/ui/approvals/{approval}")).text
    finally:
        await bob.aclose()
    asked = page.index('id="asked-heading"')
    decide = page.index('id="decide-heading"')
    assert asked < decide < page.index('id="votes-heading"') < page.index('id="assignment-heading"')
    box = page[decide : page.index('id="votes-heading"')]
    assert box.index(">Approve</button>") < box.index(">Approve with these arguments</button>")
    assert box.index(">Approve with these arguments</button>") < box.index(">Reject</button>")
    assert f'name="reason" rows="3" required maxlength="{MAX_REASON_LENGTH}"' in box
    assert "Run the tool (restart)" not in page


async def test_a_reject_from_the_page(served: tuple[GuardedApp, str]) -> None:
    """An empty reason is a 400 with the field marked and nothing recorded; a reason rejects:
    nothing is booked, the model reports it, and the page, history and CSV say why."""
    app, base = served
    approval = await ask_transfer(base)
    path = f"/ui/approvals/{approval}"
    bob = await signed_in(base, "bob")
    try:
        page = await bob.get(path)
        empty = await bob.post(
            f"{path}/decision",
            data={"csrf_token": csrf_of(page.text), "action": "reject", "reason": "   "},
        )
        assert empty.status_code == 400
        assert "Give a reason of 1 to 2000 characters to reject." in empty.text
        assert 'aria-invalid="true"' in empty.text
        assert 'id="decide-heading"' in (await bob.get(path)).text  # still open
        done = await bob.post(
            f"{path}/decision",
            data={
                "csrf_token": csrf_of(page.text),
                "action": "reject",
                "reason": "Carol is not a known payee.",
            },
        )
        assert done.status_code == 303, done.text
        assert app.transfers == []
        shown = await bob.get(done.headers["location"])
        assert "rejected: Carol is not a known payee." in shown.text
        history = await bob.get("/ui/history")
        assert "rejected: Carol is not a known payee." in history.text
        exported = await bob.get("/ui/history.csv")
        rows = list(csv.DictReader(io.StringIO(exported.text)))
        assert [json.loads(r["answer"])["reject"]["reason"] for r in rows] == [
            "Carol is not a known payee."
        ]
        assert [r["decided_by"] for r in rows] == ["bob"]
        assert [r["decision"] for r in rows] == ["rejected: Carol is not a known payee."]
        assert [json.loads(r["arguments"]) for r in rows] != [None]
    finally:
        await bob.aclose()
    store = app.agent.store
    assert store is not None
    turn_id = approval.split(":")[0]
    turn = await store.get_turn(turn_id)
    assert turn is not None
    latest = await store.latest_turn(turn.session_id)
    assert latest is not None
    messages = await store.load_conversation(latest.id)
    assert messages[-1].text == "The transfer was rejected: Carol is not a known payee."


async def test_approve_from_the_page_runs_the_guarded_tool(served: tuple[GuardedApp, str]) -> None:
    """The Approve button of a tool that paused itself runs it once with its arguments."""
    app, base = served
    approval = await ask_transfer(base)
    path = f"/ui/approvals/{approval}"
    bob = await signed_in(base, "bob")
    try:
        page = await bob.get(path)
        done = await bob.post(
            f"{path}/decision", data={"csrf_token": csrf_of(page.text), "action": "approve"}
        )
        assert done.status_code == 303, done.text
    finally:
        await bob.aclose()
    assert [(r.amount, r.toAccount) for _key, r in app.transfers] == [(40, "carol")]


@pytest.fixture
async def open_banking() -> AsyncIterator[tuple[BankingApp, httpx.AsyncClient]]:
    """The banking example (an interrupt asking yes or no) in memory, with no authenticator."""
    app = banking.build()
    async with (
        serve_in_loop(create_app(app.ai, ui_settings=SETTINGS)) as base,
        httpx.AsyncClient(base_url=base) as client,
    ):
        yield app, client


async def test_an_interrupt_asking_yes_or_no_gets_approve_and_reject_buttons(
    open_banking: tuple[BankingApp, httpx.AsyncClient],
) -> None:
    """userApproval's page offers Approve (one click: approved true), its full form and
    Reject; Approve runs the transfer, Reject of the second one books nothing."""
    app, client = open_banking
    chat = app.banking_agent.chat()
    await chat.send("Transfer $20 to alice and $30 to bob")
    snapshot = chat.snapshot_id
    first = f"/ui/approvals/{snapshot}:approval-1"
    page = await client.get(first)
    box = page.text[page.text.index('id="decide-heading"') :]
    assert box.index(">Approve</button>") < box.index(">Submit decision</button>")
    assert box.index(">Submit decision</button>") < box.index(">Reject</button>")
    approved = await client.post(
        f"{first}/decision", data={"csrf_token": csrf_of(page.text), "action": "approve"}
    )
    assert approved.status_code == 303, approved.text
    second = f"/ui/approvals/{snapshot}:approval-2"
    page = await client.get(second)
    rejected = await client.post(
        f"{second}/decision",
        data={"csrf_token": csrf_of(page.text), "action": "reject", "reason": "Bob is new."},
    )
    assert rejected.status_code == 303, rejected.text
    assert [(r.amount, r.toAccount) for _key, r in app.transfers] == [(20, "alice")]
    store = app.banking_agent.store
    assert store is not None
    first_row = next(c for c in await store.list_calls(str(snapshot)) if c.ref == "approval-1")
    assert first_row.answer == {"respond": {"approved": True}}
