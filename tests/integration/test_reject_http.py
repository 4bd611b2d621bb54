"""Reject over real HTTP without a browser, on PostgreSQL: the JSON inbox's decision
``{"reject": {"reason": ...}}`` refuses a missing, empty or oversized reason with a 400 and
records nothing; a valid one never runs the transfer, and the chat's last answer reports the
refusal with its reason."""

from __future__ import annotations

from typing import Any

import pytest

from engine.rejection import MAX_REASON_LENGTH
from examples.guarded_banking import GuardedApp
from tests.integration.guarded_support import ask_transfer, client_of, served

__all__ = ["served"]  # the fixture these tests take


@pytest.mark.parametrize(
    "body",
    [
        {"reject": {}},
        {"reject": {"reason": ""}},
        {"reject": {"reason": "   "}},
        {"reject": {"reason": "x" * (MAX_REASON_LENGTH + 1)}},
        {"reject": {"reason": 7}},
        {"reject": {"reason": "no", "by": "somebody else"}},
        {"reject": {"reason": "no"}, "restart": True},
        {"reject": None, "restart": False},
    ],
)
async def test_a_reject_without_a_fitting_reason_is_a_400(
    served: tuple[GuardedApp, str], body: dict[str, Any]
) -> None:
    """A reject needs a reason of 1 to 2,000 characters and nothing else: anything else is a
    400 and the approval stays open."""
    app, base = served
    approval = await ask_transfer(base)
    async with client_of(base, "bob") as bob:
        refused = await bob.post(f"/inbox/{approval}/decision", json=body)
        assert refused.status_code == 400, refused.text
        assert refused.json()["status"] == "INVALID_ARGUMENT"
        assert (await bob.get(f"/inbox/{approval}")).status_code == 200
        listed = (await bob.get("/inbox")).json()["items"]
    assert [a["id"] for a in listed] == [approval]
    assert app.transfers == []


async def test_a_reject_over_http_books_nothing_and_the_model_reports_it(
    served: tuple[GuardedApp, str],
) -> None:
    """mallory may not reject (403); bob's reject decides, the transfer never runs, the chat's
    answer says why, and a second decision is a 409."""
    app, base = served
    approval = await ask_transfer(base)
    path = f"/inbox/{approval}/decision"
    body = {"reject": {"reason": "Carol is not a known payee."}}
    async with client_of(base, "mallory") as mallory:
        assert (await mallory.post(path, json=body)).status_code in (403, 404)
    async with client_of(base, "bob") as bob:
        decided = await bob.post(path, json=body)
        assert decided.status_code == 200, decided.text
        result = decided.json()
        assert (result["decided"], result["decidedBy"]) == (True, "bob")
        assert result["resumeSnapshotId"]
        again = await bob.post(path, json={"reject": {"reason": "twice"}})
        assert again.status_code == 409
    assert app.transfers == []
    async with client_of(base, "alice") as alice:
        snapshot = await alice.post(
            "/api/guardedAgent/getSnapshot",
            json={"data": {"snapshotId": result["resumeSnapshotId"]}},
        )
    assert snapshot.status_code == 200, snapshot.text
    messages = snapshot.json()["result"]["state"]["messages"]
    refusal = [
        part
        for message in messages
        if message["role"] == "tool"
        for part in message["content"]
        if "toolResponse" in part
    ]
    assert [p["toolResponse"]["output"] for p in refusal] == [
        {"rejected": True, "reason": "Carol is not a known payee.", "by": "bob"}
    ]
    assert refusal[0]["metadata"]["rejected"]["by"] == "bob"
    assert messages[-1]["content"] == [
        {"text": "The transfer was rejected: Carol is not a known payee."}
    ]
