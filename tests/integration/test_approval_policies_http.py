"""Approval policies over real HTTP (POST /inbox/{id}/decision): the maker-checker 403 and a
two-person quorum, on the in-memory store and on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine.approval_policy import ApprovalPolicy, role
from engine.remote.auth import BearerTokenAuth, Principal, RoleInboxPolicy
from tests.http_fixtures import Served, serve_banking

APPROVER = frozenset({"approver"})
TOKENS: dict[str, Principal | str] = {
    "tok-alice": Principal("alice", roles=APPROVER),  # the requester, an approver too
    "tok-bob": Principal("bob", roles=APPROVER),
    "tok-carol": Principal("carol", roles=APPROVER),
    "tok-mallory": "mallory",
}


@pytest.fixture(params=["memory", "postgres"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """The banking app whose userApproval needs two approvers holding ``approver``."""
    async with serve_banking(
        request.param, auth=BearerTokenAuth(TOKENS), inbox_policy=RoleInboxPolicy("approver")
    ) as served:
        served.app.user_approval.approval_policy = ApprovalPolicy(
            approvers=role("approver"), required_approvals=2
        )
        yield served


async def paused(served: Served) -> str:
    """alice asks for a transfer; the inbox id of its approval."""
    result = await served.send("transfer $40 to carol", token="tok-alice")
    assert result["finishReason"] == "interrupted", result
    return f"{result['snapshotId']}:approval-1"


async def shown(served: Served, approval: str, token: str) -> dict[str, Any]:
    reply = await served.http.get(
        f"{served.url}/inbox/{approval}", headers={"Authorization": f"Bearer {token}"}
    )
    assert reply.status_code == 200, reply.text
    item: dict[str, Any] = reply.json()
    return item


APPROVE = {"respond": {"approved": True}}


async def test_requester_gets_403_and_nothing_is_written(served: Served) -> None:
    """The requester's own approval is refused with 403 PERMISSION_DENIED (maker-checker); a
    principal the inbox policy hides it from still gets 404."""
    approval = await paused(served)
    reply = await served.decide(approval, APPROVE, token="tok-alice")
    assert reply.status_code == 403, reply.text
    assert reply.json()["status"] == "PERMISSION_DENIED"
    assert "maker-checker" in reply.json()["message"]
    hidden = await served.decide(approval, APPROVE, token="tok-mallory")
    assert hidden.status_code == 404, hidden.text
    item = await shown(served, approval, "tok-bob")
    assert item["open"] is True
    assert item["policy"]["votes"] == []
    assert item["policy"]["mayVote"] is True
    assert (await shown(served, approval, "tok-alice"))["policy"]["mayVote"] is False


async def test_two_person_quorum_over_http(served: Served) -> None:
    """bob's vote leaves the approval open (bob twice is a 409); carol's resumes the turn."""
    approval = await paused(served)
    first = await served.decide(approval, APPROVE, token="tok-bob")
    assert first.status_code == 200, first.text
    assert first.json()["decided"] is False
    assert first.json()["resumeSnapshotId"] is None
    assert [v["voter"] for v in first.json()["votes"]] == ["bob"]

    again = await served.decide(approval, APPROVE, token="tok-bob")
    assert again.status_code == 409, again.text

    page = await served.inbox(token="tok-carol")
    [item] = page["items"]
    assert item["id"] == approval
    policy = item["policy"]
    assert (policy["requiredApprovals"], policy["approvals"]) == (2, 1)
    assert policy["approvers"] == "role:approver"
    assert policy["mayVote"] is True
    assert served.app.transfers == []

    second = await served.decide(approval, APPROVE, token="tok-carol")
    assert second.status_code == 200, second.text
    body = second.json()
    assert body["decided"] is True
    assert body["decidedBy"] == "carol"
    assert body["resumeSnapshotId"] is not None
    assert [v["voter"] for v in body["votes"]] == ["bob", "carol"]
    assert [request.amount for _key, request in served.app.transfers] == [40]
    assert (await served.inbox(token="tok-carol"))["items"] == []
