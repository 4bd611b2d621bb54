"""The approval page under an approval policy, over real HTTP without a browser: the
requester's approval refused (403), votes and who may vote shown, a two-person quorum from the
form."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from engine.approval_policy import ApprovalPolicy, role
from engine.remote import BearerTokenAuth, Principal, RoleInboxPolicy, create_app
from engine.remote.ui import UiSettings
from examples.banking import BankingApp, build
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.http_support import csrf_of, serve_in_loop, signed_in_with

SETTINGS = UiSettings(secret="policy-pages-secret-0123456789abcdef", poll_seconds=1)
APPROVER = frozenset({"approver"})
TOKENS = {"alice": "alice-token", "bob": "bob-token", "carol": "carol-token"}
AUTH = BearerTokenAuth({token: Principal(id=who, roles=APPROVER) for who, token in TOKENS.items()})


@pytest.fixture
async def served() -> AsyncIterator[tuple[BankingApp, str]]:
    """The banking example on PostgreSQL (turns run inline), two approvals required."""
    async with sql_store("postgres") as store:
        app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline")
        app.user_approval.approval_policy = ApprovalPolicy(
            approvers=role("approver"), required_approvals=2
        )
        server = create_app(
            app.ai, auth=AUTH, inbox_policy=RoleInboxPolicy("approver"), ui_settings=SETTINGS
        )
        async with serve_in_loop(server) as base:
            yield app, base


async def signed_in(base: str, who: str) -> httpx.AsyncClient:
    """A client signed in to the UI as ``who``."""
    return await signed_in_with(base, TOKENS[who])


async def approve(client: httpx.AsyncClient, path: str) -> httpx.Response:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    return await client.post(
        f"{path}/decision",
        data={"csrf_token": csrf_of(page.text), "action": "respond", "field.approved": "true"},
    )


async def test_quorum_from_the_approval_page(served: tuple[BankingApp, str]) -> None:
    app, base = served
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {TOKENS['alice']}"}
    ) as api:
        started = await api.post(
            "/api/bankingAgent",
            json={
                "data": {
                    "message": {"role": "user", "content": [{"text": "transfer $40 to carol"}]}
                }
            },
        )
        assert started.status_code == 200, started.text
        assert started.json()["result"]["finishReason"] == "interrupted"
        snapshot_id = started.json()["result"]["snapshotId"]
    path = f"/ui/approvals/{snapshot_id}:approval-1"
    alice, bob, carol = [await signed_in(base, who) for who in ("alice", "bob", "carol")]
    try:
        refused = await approve(alice, path)
        assert refused.status_code == 403
        assert "maker-checker" in refused.text and "Not recorded." in refused.text

        first = await approve(bob, path)
        assert first.status_code == 303
        shown = await bob.get(first.headers["location"])
        assert "Your vote was recorded" in shown.text
        assert "1 of 2 required" in shown.text
        assert "<td>bob</td>" in shown.text
        assert "voted already" in shown.text
        assert "Waiting for a decision" in shown.text
        assert app.transfers == []

        inbox = await carol.get("/ui")
        assert "1 of 2 approvals" in inbox.text
        carol_view = await carol.get(path)
        assert "role:approver" in carol_view.text and ">may vote<" in carol_view.text
        second = await approve(carol, path)
        assert second.status_code == 303
        done = await carol.get(second.headers["location"])
        assert "Your decision was recorded." in done.text
        assert "2 of 2 required" in done.text
        assert [request.amount for _key, request in app.transfers] == [40]
    finally:
        for client in (alice, bob, carol):
            await client.aclose()
