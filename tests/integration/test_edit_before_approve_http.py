"""Edit before approve over real HTTP without a browser: the JSON inbox's decision with an
``edit``, and the approval page's arguments form, history and CSV, on PostgreSQL."""

from __future__ import annotations

import csv
import html
import io
import json
import re

from examples.guarded_banking import GuardedApp
from tests.integration.guarded_support import (
    ask_transfer,
    client_of,
    csrf_of,
    served,
    served_quorum,
    signed_in,
)

__all__ = ["served", "served_quorum"]  # the fixtures these tests take


async def test_json_inbox_edit(served: tuple[GuardedApp, str]) -> None:
    """Bad edits are 4xx and record nothing (schema violation, edit without restart, an
    approver outside the policy); a valid one runs the transfer with the edited amount."""
    app, base = served
    approval = await ask_transfer(base)
    path = f"/inbox/{approval}/decision"
    async with client_of(base, "bob") as bob, client_of(base, "mallory") as mallory:
        shown = await bob.get(f"/inbox/{approval}")
        assert shown.json()["editable"] is True
        assert shown.json()["input"] == {"amount": 40, "toAccount": "carol"}
        for body in (
            {"restart": True, "edit": {"amount": "lots"}},
            {"restart": True, "edit": []},
            {"respond": {"success": True, "transactionId": "x"}, "edit": {"amount": 1}},
        ):
            refused = await bob.post(path, json=body)
            assert refused.status_code == 400, (body, refused.text)
        denied = await mallory.post(path, json={"restart": True, "edit": {"amount": 500}})
        assert denied.status_code in (403, 404), denied.text
        assert app.transfers == []
        done = await bob.post(path, json={"restart": True, "edit": {"amount": 500}})
        assert done.status_code == 200, done.text
        assert done.json()["decided"] is True and done.json()["resumeSnapshotId"]
    assert [(r.amount, r.toAccount) for _key, r in app.transfers] == [(500, "carol")]


async def test_edit_form_history_and_csv(served: tuple[GuardedApp, str]) -> None:
    """The approval page offers the arguments as a form filled with the call's values; a
    value breaking the schema comes back marked (400); an edit records, runs, and shows its
    diff on the page, in the history and in the CSV."""
    app, base = served
    approval = await ask_transfer(base)
    path = f"/ui/approvals/{approval}"
    bob = await signed_in(base, "bob")
    try:
        page = await bob.get(path)
        assert page.status_code == 200
        assert 'name="edit.amount"' in page.text and 'value="40"' in page.text
        assert 'name="edit.toAccount"' in page.text and 'value="carol"' in page.text
        bad = await bob.post(
            f"{path}/decision",
            data={
                "csrf_token": csrf_of(page.text),
                "action": "edit",
                "edit.amount": "a lot",
                "edit.toAccount": "carol",
            },
        )
        assert bad.status_code == 400 and "The edit was not recorded." in bad.text
        unchanged = await bob.post(
            f"{path}/decision",
            data={
                "csrf_token": csrf_of(page.text),
                "action": "edit",
                "edit.amount": "40",
                "edit.toAccount": "carol",
            },
        )
        assert unchanged.status_code == 400 and "changes nothing" in unchanged.text
        assert app.transfers == []
        done = await bob.post(
            f"{path}/decision",
            data={
                "csrf_token": csrf_of(page.text),
                "action": "edit",
                "edit.amount": "500",
                "edit.toAccount": "carol",
            },
        )
        assert done.status_code == 303, done.text
        assert [r.amount for _key, r in app.transfers] == [500]
        shown = await bob.get(done.headers["location"])
        assert "Arguments edited by bob" in shown.text
        assert re.search(r"<th scope=\"row\">amount</th><td>40</td><td>500</td>", shown.text)
        history = await bob.get("/ui/history")
        assert "Approved with edited arguments: amount: 40 → 500 (by bob)" in history.text
        exported = await bob.get("/ui/history.csv")
        rows = list(csv.DictReader(io.StringIO(exported.text)))
        assert [(r["edit"], r["edited_by"]) for r in rows] == [("amount: 40 → 500 (by bob)", "bob")]
        assert [json.loads(r["arguments"])["amount"] for r in rows] == [500]
    finally:
        await bob.aclose()


async def test_a_page_read_before_an_edit_cannot_approve_it(
    served_quorum: tuple[GuardedApp, str],
) -> None:
    """Under a quorum of two, carol edits the amount while bob's page still shows 40: bob's
    approval from that page is refused (409) and not counted; reloaded, the page shows 500,
    and bob's approval then completes the quorum and runs the edited transfer."""
    app, base = served_quorum
    approval = await ask_transfer(base)
    path = f"/ui/approvals/{approval}"
    bob = await signed_in(base, "bob")
    try:
        stale = await bob.get(path)
        assert 'name="arguments"' in stale.text
        async with client_of(base, "carol") as carol:
            edited = await carol.post(
                f"/inbox/{approval}/decision", json={"restart": True, "edit": {"amount": 500}}
            )
        assert edited.status_code == 200 and edited.json()["decided"] is False
        arguments = re.search(r'name="arguments" value="([^"]+)"', stale.text)
        assert arguments is not None
        refused = await bob.post(
            f"{path}/decision",
            data={
                "csrf_token": csrf_of(stale.text),
                "action": "restart",
                "arguments": html.unescape(arguments.group(1)),
            },
        )
        assert refused.status_code == 409 and "edited after you read them" in refused.text
        assert app.transfers == []
        fresh = await bob.get(path)
        assert 'name="edit.amount"' in fresh.text and 'value="500"' in fresh.text
        fresh_arguments = re.search(r'name="arguments" value="([^"]+)"', fresh.text)
        assert fresh_arguments is not None
        done = await bob.post(
            f"{path}/decision",
            data={
                "csrf_token": csrf_of(fresh.text),
                "action": "restart",
                "arguments": html.unescape(fresh_arguments.group(1)),
            },
        )
        assert done.status_code == 303, done.text
        assert [(r.amount, r.toAccount) for _key, r in app.transfers] == [(500, "carol")]
    finally:
        await bob.aclose()
