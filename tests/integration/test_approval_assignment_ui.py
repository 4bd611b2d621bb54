"""Assignment in the inbox pages and the JSON inbox, over real HTTP without a browser: the
assignment filters, claim, release and assign forms (CSRF-checked), a claim held against
another, a reassigned approval leaving one group's inbox for another's, an escalation shown
in the history and its CSV, and a decision racing an escalation refused with a 409."""

from __future__ import annotations

import asyncio
import csv
import io
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest

from engine.approvals.assignment import claim, sweep_assignments
from engine.approvals.decide import Decision, decide, find_approval
from engine.conversation.parts import Message
from engine.escalation import escalation_chain
from engine.remote import BearerTokenAuth, Principal, RoleInboxPolicy, create_app
from engine.remote.ui import UiSettings
from engine.store import TurnInput
from engine.turns.request import TurnRequest
from examples.banking import BankingApp, build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import libpq_dsn, sql_store
from tests.http_support import csrf_of, serve_in_loop, signed_in_with
from tests.integration.test_approval_assignment import (
    SLOW_ESCALATION_COMMIT,
    wait_until_a_commit_sleeps,
)

SETTINGS = UiSettings(secret="assignment-pages-secret-0123456789abcdef", poll_seconds=1)
ROLES = {
    "alice": {"approver"},
    "dave": {"approver", "payments"},
    "erin": {"approver", "payments"},
    "lena": {"approver", "leads"},
}
TOKENS = {who: f"{who}-assignment-token" for who in ROLES}
AUTH = BearerTokenAuth(
    {TOKENS[who]: Principal(id=who, roles=frozenset(roles)) for who, roles in ROLES.items()}
)


@pytest.fixture
async def served() -> AsyncIterator[tuple[BankingApp, str, str]]:
    """The banking example on PostgreSQL, userApproval assigned to payments; alice asked."""
    async with sql_store("postgres") as store:
        app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
        app.user_approval.group = "payments"
        server = create_app(
            app.ai, auth=AUTH, inbox_policy=RoleInboxPolicy("approver"), ui_settings=SETTINGS
        )
        async with (
            serve_in_loop(server) as base,
            httpx.AsyncClient(
                base_url=base, headers={"Authorization": f"Bearer {TOKENS['alice']}"}
            ) as api,
        ):
            message = {"role": "user", "content": [{"text": "transfer $40 to carol"}]}
            started = await api.post("/api/bankingAgent", json={"data": {"message": message}})
            assert started.json()["result"]["finishReason"] == "interrupted"
            yield app, base, started.json()["result"]["snapshotId"]


async def signed_in(base: str, who: str) -> httpx.AsyncClient:
    """A client signed in to the UI as ``who``."""
    return await signed_in_with(base, TOKENS[who])


async def post_form(
    client: httpx.AsyncClient, path: str, route: str, **fields: str
) -> httpx.Response:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    return await client.post(f"{path}/{route}", data={"csrf_token": csrf_of(page.text), **fields})


async def listed(client: httpx.AsyncClient, turn_id: str, assigned: str = "") -> bool:
    page = await client.get("/ui", params={"assigned": assigned} if assigned else None)
    assert page.status_code == 200, page.text
    return turn_id in page.text


async def test_claim_release_and_reassign_from_the_pages(
    served: tuple[BankingApp, str, str],
) -> None:
    """Group members see the approval and filter it; a claim is shown and held against
    another member; reassigning to leads moves it out of payments' inbox into leads'."""
    app, base, turn_id = served
    path = f"/ui/approvals/{turn_id}:approval-1"
    dave, erin, lena = [await signed_in(base, who) for who in ("dave", "erin", "lena")]
    try:
        assert await listed(dave, turn_id)
        assert await listed(dave, turn_id, "groups")
        assert not await listed(dave, turn_id, "me")
        assert not await listed(dave, turn_id, "unassigned")
        assert not await listed(lena, turn_id), "assigned to payments: not leads' to decide"
        assert "group payments" in (await dave.get("/ui")).text

        no_token = await dave.post(f"{path}/claim", data={"csrf_token": "forged"})
        assert no_token.status_code == 403
        claimed = await post_form(dave, path, "claim")
        assert claimed.status_code == 303
        shown = await dave.get(claimed.headers["location"])
        assert "You hold this approval now." in shown.text
        assert "dave (group payments)" in shown.text
        assert "Release it" in shown.text
        assert await listed(dave, turn_id, "me")

        held = await post_form(erin, path, "claim")
        assert held.status_code == 409
        assert "claimed by dave" in held.text
        released = await post_form(dave, path, "release")
        assert released.status_code == 303

        moved = await post_form(erin, path, "assign", group="leads", assignee="")
        assert moved.status_code == 303
        assert not await listed(erin, turn_id)
        assert await listed(lena, turn_id, "groups")
        refused = await post_form(
            erin, path, "decision", action="respond", **{"field.approved": "true"}
        )
        assert refused.status_code == 403
        assert "group leads" in refused.text
        decided = await post_form(
            lena, path, "decision", action="respond", **{"field.approved": "true"}
        )
        assert decided.status_code == 303
        assert [request.amount for _key, request in app.transfers] == [40]
    finally:
        for client in (dave, erin, lena):
            await client.aclose()


async def test_a_bad_assignment_filter_or_name_is_a_400(
    served: tuple[BankingApp, str, str],
) -> None:
    """An unknown filter value, or assigning to nobody, is refused and changes nothing."""
    _app, base, turn_id = served
    path = f"/ui/approvals/{turn_id}:approval-1"
    dave = await signed_in(base, "dave")
    try:
        assert (await dave.get("/ui", params={"assigned": "everyone"})).status_code == 400
        empty = await post_form(dave, path, "assign", group="", assignee="")
        assert empty.status_code == 400
        assert "Assign to a person, a group, or both." in empty.text
        assert "group payments" in (await dave.get(path)).text
    finally:
        await dave.aclose()


async def test_the_json_inbox_shows_filters_and_changes_assignments(
    served: tuple[BankingApp, str, str],
) -> None:
    """``GET /inbox`` carries the assignment and filters by it; ``POST .../assignment`` claims
    (409 when held by another), releases (403 for a non-holder) and assigns."""
    _app, base, turn_id = served
    approval = f"{turn_id}:approval-1"

    def api(who: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKENS[who]}"})

    async with api("dave") as dave, api("erin") as erin, api("lena") as lena:
        items = (await dave.get("/inbox")).json()["items"]
        assert [i["assignment"]["group"] for i in items] == ["payments"]
        assert (await dave.get("/inbox", params={"assigned": "me"})).json()["items"] == []
        assert (await lena.get("/inbox")).json()["items"] == []
        bad = await dave.get("/inbox", params={"assigned": "all"})
        assert bad.status_code == 400

        change = f"/inbox/{approval}/assignment"
        claimed = await dave.post(change, json={"action": "claim"})
        assert claimed.status_code == 200, claimed.text
        assert (claimed.json()["assignee"], claimed.json()["group"]) == ("dave", "payments")
        mine = (await dave.get("/inbox", params={"assigned": "me"})).json()["items"]
        assert [i["id"] for i in mine] == [approval]
        assert (await erin.post(change, json={"action": "claim"})).status_code == 409
        assert (await erin.post(change, json={"action": "release"})).status_code == 403
        assert (await erin.post(change, json={"action": "steal"})).status_code == 400
        moved = await dave.post(change, json={"action": "assign", "group": "leads"})
        assert moved.status_code == 200
        assert (moved.json()["assignee"], moved.json()["group"]) == (None, "leads")
        shown = (await lena.get(f"/inbox/{approval}")).json()
        assert shown["assignment"]["group"] == "leads"
        assert shown["assignment"]["assignedBy"] == "dave"


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_history_shows_the_escalation_before_a_decision(backend: str) -> None:
    """An approval escalated from payments (claimed by dave) to leads and then decided by
    lena is listed in the history page and the CSV with when and where it escalated."""
    async with sql_store(backend) as store:
        app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
        interrupt = app.user_approval
        interrupt.group = "payments"
        interrupt.escalation = escalation_chain(interrupt.name, {"escalate": "leads"}, timeout=60)
        response = await app.banking_agent.run_turn(
            TurnRequest(
                input=TurnInput(kind="message", message=Message.user("transfer $40 to carol")),
                owner="alice",
            )
        )
        assert response.snapshot_id is not None
        found = await find_approval(store, response.snapshot_id, "approval-1")
        assert found is not None and found[1]
        approval = found[0]
        dave = Principal("dave", roles=frozenset(ROLES["dave"]))
        lena = Principal("lena", roles=frozenset(ROLES["lena"]))
        await claim(app.banking_agent, approval, dave)
        later = approval.created_at + timedelta(seconds=61)
        assert (await sweep_assignments(app.ai, store, now=later)).escalated
        decision = Decision(respond={"approved": True})
        await decide(app.banking_agent, approval, decision, decided_by="lena", approver=lena)
        async with (
            serve_in_loop(create_app(app.ai, ui_settings=SETTINGS)) as base,
            httpx.AsyncClient(base_url=base) as client,
        ):
            page = await client.get("/ui/history")
            exported = await client.get("/ui/history.csv")
    assert page.status_code == 200 and exported.status_code == 200
    escalated = re.search(r'<span class="summary escalation">(.*?)</span>', page.text, re.S)
    assert escalated is not None, "the history shows no escalation"
    assert "from group payments (held by dave) to group leads" in escalated.group(1)
    assert "<time datetime=" in escalated.group(1)
    [row] = list(csv.DictReader(io.StringIO(exported.text)))
    assert row["decided_by"] == "lena"
    assert (row["escalated_from_group"], row["escalated_from_assignee"]) == ("payments", "dave")
    assert row["escalated_to"] == "leads"
    assert datetime.fromisoformat(row["escalated_at"]) == later  # the sweep's clock


async def test_a_decision_racing_an_escalation_is_a_409(
    served: tuple[BankingApp, str, str],
) -> None:
    """Over HTTP on PostgreSQL, dave posts a decision on the approval he claimed while the
    sweep's escalation to leads commits: a 409 saying it was reassigned, nothing recorded,
    and the approval open for leads, whose decision then runs the transfer."""
    app, base, turn_id = served
    approval = f"{turn_id}:approval-1"
    store = app.banking_agent.store
    assert isinstance(store, SqlSessionStore)
    app.user_approval.escalation = escalation_chain(
        app.user_approval.name, {"escalate": "leads"}, timeout=60
    )

    def api(who: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKENS[who]}"})

    async with api("dave") as dave, api("lena") as lena:
        claimed = await dave.post(f"/inbox/{approval}/assignment", json={"action": "claim"})
        assert claimed.status_code == 200, claimed.text
        with psycopg.connect(libpq_dsn(store.url), autocommit=True) as admin:
            admin.execute(SLOW_ESCALATION_COMMIT)
        later = datetime.now(UTC) + timedelta(minutes=5)
        sweep = asyncio.ensure_future(sweep_assignments(app.ai, store, now=later))
        try:
            await wait_until_a_commit_sleeps(store.url.render_as_string(hide_password=False))
            approve = {"respond": {"approved": True}}
            refused = await dave.post(f"/inbox/{approval}/decision", json=approve)
            report = await sweep
        finally:
            sweep.cancel()
        assert refused.status_code == 409, refused.text
        assert "reassigned" in refused.json()["message"]
        assert len(report.escalated) == 1
        shown = (await lena.get(f"/inbox/{approval}")).json()
        assert shown["open"] is True and shown["assignment"]["group"] == "leads"
        assert app.transfers == []
        decided = await lena.post(f"/inbox/{approval}/decision", json=approve)
        assert decided.status_code == 200, decided.text
        assert len(app.transfers) == 1
