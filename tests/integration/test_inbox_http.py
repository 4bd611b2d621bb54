"""The approval inbox over real HTTP: list, filter, page, show and decide open approvals.

Every test runs against the in-memory store and against PostgreSQL (turns run inline in the
server process, so the resume a decision enqueues runs and settles before the answer).
alice and bob own sessions; carol holds the ``approver`` role and sees everyone's approvals.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine.conversation.parts import Part
from engine.errors import DecisionConflictError
from engine.remote.auth import OwnerInboxPolicy, Principal, RoleInboxPolicy
from engine.store import PendingApproval, ToolCallStatus
from tests.http_fixtures import (
    AUDIT_AGENT,
    Served,
    approval_resume,
    bearer,
    serve_banking,
    token_auth,
)
from workers import WorkerPool

CAROL = "tok-carol"  # the approver


@pytest.fixture(params=["memory", "postgres"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """The banking app over HTTP with bearer tokens and an ``approver`` role."""
    async with serve_banking(
        request.param, auth=token_auth(), inbox_policy=RoleInboxPolicy("approver")
    ) as served:
        yield served


@pytest.fixture(params=["memory", "postgres", "postgres-queued"])
async def audited(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """:func:`served`, and also with turns queued for a worker pool (the default path of
    ``turnstile serve`` plus ``turnstile worker``), where the server waits for its turns."""
    kind, _, queued = str(request.param).partition("-")
    async with contextlib.AsyncExitStack() as stack:
        served = await stack.enter_async_context(
            serve_banking(
                kind,
                auth=token_auth(),
                inbox_policy=RoleInboxPolicy("approver"),
                execution="workers" if queued else "inline",
            )
        )
        if queued:
            pool = WorkerPool(served.app.ai, served.store, poll_interval=0.05, scheduler=False)
            await stack.enter_async_context(pool)
        yield served


async def settled(served: Served, snapshot_id: str, token: str) -> dict[str, Any]:
    """The snapshot once it is no longer pending (a worker may still be running it)."""
    for _ in range(200):
        snapshot = await served.snapshot(snapshot_id, token=token)
        if snapshot["status"] != "pending":
            return snapshot
        await asyncio.sleep(0.05)
    raise AssertionError(f"{snapshot_id} did not settle")


def ids(page: dict[str, Any]) -> list[str]:
    return [item["id"] for item in page["items"]]


async def pause(served: Served, text: str, token: str, agent: str = "bankingAgent") -> str:
    """Start a session that pauses at its approval(s); the paused snapshot id."""
    result = await served.send(text, token=token, agent=agent)
    assert result["finishReason"] == "interrupted", result
    snapshot_id: str = result["snapshotId"]
    return snapshot_id


def last_text(snapshot: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in snapshot["state"]["messages"][-1]["content"])


async def test_lists_open_approvals_across_sessions_oldest_first(served: Served) -> None:
    """GET /inbox lists every open approval of every session, oldest first, and nothing else."""
    first = await pause(served, "transfer $40 to carol", "tok-alice")
    second = await pause(served, "transfer $15 to dave", "tok-bob")
    third = await pause(served, "transfer $10 to a and $20 to b", "tok-alice")
    await served.send("hello there", token="tok-alice")  # no approval at all
    answered = await pause(served, "transfer $5 to erin", "tok-bob")
    reply = await served.decide(
        f"{answered}:approval-1", {"respond": {"approved": False}}, token=CAROL
    )
    assert reply.status_code == 200, reply.text

    page = await served.inbox(token=CAROL)

    assert ids(page) == [
        f"{first}:approval-1",
        f"{second}:approval-1",
        f"{third}:approval-1",
        f"{third}:approval-2",
    ]
    assert page["nextCursor"] is None
    item = page["items"][0]
    assert item["agent"] == "bankingAgent"
    assert item["owner"] == "alice"
    assert item["interrupt"] == "userApproval"
    assert item["ref"] == "approval-1"
    assert item["turnId"] == first
    assert item["input"] == {"action": "transferMoney", "details": "Transfer $40 to carol"}
    assert [i["owner"] for i in page["items"]] == ["alice", "bob", "alice", "alice"]


async def test_each_filter_narrows_the_listing(served: Served) -> None:
    """The agent, interrupt, owner and min_age filters each keep exactly the matching approvals."""
    old = await pause(served, "transfer $40 to carol", "tok-alice")
    await asyncio.sleep(1.0)
    audit = await pause(served, "transfer $15 to dave", "tok-bob", agent=AUDIT_AGENT)
    bobs = await pause(served, "transfer $7 to frank", "tok-bob")
    everything = await served.inbox(token=CAROL)
    assert ids(everything) == [f"{old}:approval-1", f"{audit}:approval-1", f"{bobs}:approval-1"]

    # Ages only grow: a threshold just under the oldest one's age keeps it and (taken well
    # within the second between the two) drops the younger ones.
    ages = [item["ageSeconds"] for item in everything["items"]]
    assert ages[0] - ages[1] >= 0.9
    aged = await served.inbox(token=CAROL, min_age=ages[0] - 0.3)
    assert ids(aged) == [f"{old}:approval-1"]
    assert ids(await served.inbox(token=CAROL, min_age=3600)) == []

    by_agent = await served.inbox(token=CAROL, agent=AUDIT_AGENT)
    assert ids(by_agent) == [f"{audit}:approval-1"]
    assert ids(await served.inbox(token=CAROL, agent="bankingAgent")) == [
        f"{old}:approval-1",
        f"{bobs}:approval-1",
    ]
    assert ids(await served.inbox(token=CAROL, agent="noSuchAgent")) == []

    assert ids(await served.inbox(token=CAROL, interrupt="userApproval")) == ids(everything)
    assert ids(await served.inbox(token=CAROL, interrupt="transferMoney")) == []

    assert ids(await served.inbox(token=CAROL, owner="alice")) == [f"{old}:approval-1"]
    assert ids(await served.inbox(token=CAROL, owner="bob")) == [
        f"{audit}:approval-1",
        f"{bobs}:approval-1",
    ]


async def test_pages_with_limit_and_cursor_have_no_duplicates_and_no_gaps(served: Served) -> None:
    """Walking the inbox with limit and nextCursor yields each open approval exactly once."""
    for n in range(3):
        await pause(served, f"transfer ${n + 1} to x{n} and ${n + 10} to y{n}", "tok-alice")
        await pause(served, f"transfer ${n + 20} to z{n}", "tok-bob")
    everything = ids(await served.inbox(token=CAROL))
    assert len(everything) == 9

    for limit in (1, 2, 4, 9):
        walked: list[str] = []
        cursor: str | None = None
        for _ in range(20):
            params: dict[str, Any] = {"limit": limit}
            if cursor is not None:
                params["cursor"] = cursor
            page = await served.inbox(token=CAROL, **params)
            assert len(page["items"]) <= limit
            # A cursor promises more: following one never lands on an empty page.
            assert page["items"], f"limit={limit}: empty page after a cursor"
            walked.extend(ids(page))
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert walked == everything, f"limit={limit}"


def _cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "not-a-cursor!",
        "%%%",
        _cursor({"created": "2026-01-01T00:00:00+00:00"}),
        _cursor(["2026-01-01T00:00:00+00:00", "turn"]),
        _cursor([1, 2, 3]),
        _cursor(["yesterday", "turn", "ref"]),
        # Well-formed, but not a moment in time anyone can compare with (no offset).
        _cursor(["2026-01-01T00:00:00", "turn", "ref"]),
        _cursor(["2026-01-01T00:00:00+00:00", "turn\u0000", "ref"]),
    ],
    ids=[
        "garbage",
        "percent signs",
        "an object",
        "two fields",
        "numbers",
        "not a date",
        "naive timestamp",
        "NUL in turn id",
    ],
)
async def test_a_malformed_cursor_is_a_400(served: Served, cursor: str) -> None:
    """A cursor the server did not hand out is refused with 400 and a JSON error."""
    await pause(served, "transfer $40 to carol", "tok-alice")
    reply = await served.http.get(
        f"{served.url}/inbox", params={"cursor": cursor}, headers=bearer(CAROL)
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["status"] == "INVALID_ARGUMENT"
    assert "cursor" in reply.json()["message"]


@pytest.mark.parametrize(
    "params",
    [{"limit": "0"}, {"limit": "201"}, {"limit": "ten"}, {"min_age": "-1"}, {"min_age": "nan"}],
)
async def test_bad_paging_parameters_are_a_400(served: Served, params: dict[str, str]) -> None:
    """A limit or min_age that is not a number in range is refused with 400 naming it."""
    reply = await served.http.get(f"{served.url}/inbox", params=params, headers=bearer(CAROL))
    assert reply.status_code == 400, reply.text
    assert next(iter(params)) in reply.json()["message"]


async def test_show_returns_the_approval_with_its_conversation(served: Served) -> None:
    """GET /inbox/{id} shows the open approval and the conversation of its turn."""
    paused = await pause(served, "transfer $40 to carol", "tok-alice")

    reply = await served.http.get(f"{served.url}/inbox/{paused}:approval-1", headers=bearer(CAROL))

    assert reply.status_code == 200, reply.text
    shown = reply.json()
    assert shown["id"] == f"{paused}:approval-1"
    assert shown["open"] is True
    assert shown["owner"] == "alice"
    assert shown["input"]["details"] == "Transfer $40 to carol"
    roles = [m["role"] for m in shown["messages"]]
    assert roles == ["user", "model"]
    assert shown["messages"][0]["content"] == [{"text": "transfer $40 to carol"}]
    request = shown["messages"][1]["content"][0]["toolRequest"]
    assert (request["name"], request["ref"]) == ("userApproval", "approval-1")
    missing = await served.http.get(
        f"{served.url}/inbox/{paused}:approval-9", headers=bearer(CAROL)
    )
    assert missing.status_code == 404
    assert missing.json()["status"] == "NOT_FOUND"


async def test_a_respond_decision_resumes_the_turn_to_completion(served: Served) -> None:
    """Answering a turn's only approval enqueues its resume, which transfers and completes."""
    paused = await pause(served, "transfer $40 to carol", "tok-alice")

    reply = await served.decide(
        f"{paused}:approval-1", {"respond": {"approved": True}}, token=CAROL
    )

    assert reply.status_code == 200, reply.text
    outcome = reply.json()
    assert outcome["decidedBy"] == "carol"
    assert outcome["decidedAt"] is not None
    assert outcome["waitingFor"] == []
    resumed = await served.snapshot(outcome["resumeSnapshotId"], token="tok-alice")
    assert resumed["status"] == "completed"
    assert resumed["finishReason"] == "stop"
    assert resumed["parentId"] == paused
    assert last_text(resumed) == "Done. Transaction txn-40-carol."
    assert [t.toAccount for _key, t in served.app.transfers] == ["carol"]
    assert ids(await served.inbox(token=CAROL)) == []
    shown = await served.http.get(f"{served.url}/inbox/{paused}:approval-1", headers=bearer(CAROL))
    assert shown.json()["open"] is False


async def test_a_two_interrupt_turn_resumes_after_its_second_decision(served: Served) -> None:
    """The first of two decisions only waits; the second enqueues the resume of both."""
    paused = await pause(served, "transfer $10 to a and $20 to b", "tok-alice")

    first = await served.decide(
        f"{paused}:approval-1", {"respond": {"approved": True}}, token=CAROL
    )

    assert first.status_code == 200, first.text
    assert first.json()["waitingFor"] == ["approval-2"]
    assert first.json()["resumeSnapshotId"] is None
    assert served.app.transfers == []
    latest = await served.http.post(
        f"{served.agent_url}/getSnapshot",
        json={
            "data": {"sessionId": (await served.snapshot(paused, token="tok-alice"))["sessionId"]}
        },
        headers=bearer("tok-alice"),
    )
    assert latest.json()["result"]["snapshotId"] == paused
    assert ids(await served.inbox(token=CAROL)) == [f"{paused}:approval-2"]

    second = await served.decide(
        f"{paused}:approval-2", {"respond": {"approved": True}}, token="tok-alice"
    )

    assert second.status_code == 200, second.text
    assert second.json()["waitingFor"] == []
    resumed = await served.snapshot(second.json()["resumeSnapshotId"], token="tok-alice")
    assert resumed["finishReason"] == "stop"
    assert "txn-10-a" in last_text(resumed)
    assert "txn-20-b" in last_text(resumed)
    assert sorted(t.toAccount for _key, t in served.app.transfers) == ["a", "b"]
    calls = {c.ref: c for c in await served.store.list_calls(paused)}
    assert (calls["approval-1"].decided_by, calls["approval-2"].decided_by) == ("carol", "alice")


async def test_decisions_record_who_decided_and_when(audited: Served) -> None:
    """Each decision keeps its decider and moment on the journal row, through the resume,
    whether the server runs the resume itself or queues it for a worker."""
    served = audited
    paused = await pause(served, "transfer $10 to a and $20 to b", "tok-alice")
    first = await served.decide(
        f"{paused}:approval-1", {"respond": {"approved": True}}, token=CAROL
    )
    await asyncio.sleep(0.05)
    second = await served.decide(
        f"{paused}:approval-2", {"respond": {"approved": False}}, token="tok-alice"
    )
    assert (first.status_code, second.status_code) == (200, 200)

    calls = {c.ref: c for c in await served.store.list_calls(paused)}
    assert calls["approval-1"].decided_by == "carol"
    assert calls["approval-2"].decided_by == "alice"
    assert calls["approval-1"].status is ToolCallStatus.ANSWERED
    assert calls["approval-1"].decided_at is not None
    assert calls["approval-1"].decided_at.isoformat() == first.json()["decidedAt"]
    if served.is_sql:
        rows = served.sql(
            "SELECT ref, decided_by, decided_at, answer FROM tool_calls "
            "WHERE turn_id = :turn ORDER BY ref",
            turn=paused,
        )
        assert [(r.ref, r.decided_by) for r in rows] == [
            ("approval-1", "carol"),
            ("approval-2", "alice"),
        ]
        assert rows[0].decided_at < rows[1].decided_at
        assert rows[0].decided_at.isoformat() == first.json()["decidedAt"]
        assert rows[1].answer == {"respond": {"approved": False}}


async def test_a_recorded_decision_cannot_be_overwritten_by_a_resume(audited: Served) -> None:
    """After an approver decided one approval, a chat resume (local or over HTTP) answering
    it differently is a 409 that changes nothing; one repeating the decision goes through
    and the record still names the approver."""
    served = audited
    paused = await pause(served, "transfer $10 to a and $20 to b", "tok-alice")
    rejected = await served.decide(
        f"{paused}:approval-1", {"respond": {"approved": False}}, token=CAROL
    )
    assert rejected.status_code == 200, rejected.text

    remote = await served.http.post(
        served.agent_url,
        json=approval_resume({"snapshotId": paused}, True, True),
        headers=bearer("tok-alice"),
    )
    # Over Genkit's protocol a refused turn is a failed result carrying the typed conflict.
    refusal = remote.json()["result"]
    assert refusal["finishReason"] == "failed", remote.text
    assert refusal["error"]["status"] == "ABORTED"
    assert refusal["error"]["details"] == {"type": "DecisionConflictError"}
    assert "already decided by carol" in refusal["error"]["message"]
    chat = served.app.banking_agent.chat(snapshot_id=paused)
    with pytest.raises(DecisionConflictError):
        await chat.resume(
            respond=[
                Part.of_response("userApproval", "approval-1", {"approved": True}),
                Part.of_response("userApproval", "approval-2", {"approved": True}),
            ]
        )
    calls = {c.ref: c for c in await served.store.list_calls(paused)}
    assert calls["approval-1"].status is ToolCallStatus.INTERRUPTED
    assert (calls["approval-1"].answer, calls["approval-1"].decided_by) == (
        {"respond": {"approved": False}},
        "carol",
    )
    assert served.app.transfers == []

    agreeing = await served.http.post(
        served.agent_url,
        json=approval_resume({"snapshotId": paused}, False, True),
        headers=bearer("tok-alice"),
    )
    assert agreeing.status_code == 200, agreeing.text
    resumed = await settled(served, agreeing.json()["result"]["snapshotId"], "tok-alice")
    assert resumed["status"] == "completed", resumed
    assert [t.toAccount for _key, t in served.app.transfers] == ["b"]
    calls = {c.ref: c for c in await served.store.list_calls(paused)}
    assert [(calls[r].status, calls[r].decided_by) for r in ("approval-1", "approval-2")] == [
        (ToolCallStatus.ANSWERED, "carol"),
        (ToolCallStatus.ANSWERED, "alice"),
    ]


async def test_a_second_decision_on_the_same_approval_is_a_409(served: Served) -> None:
    """An approval is decided once: deciding it again is a 409, before or after the resume."""
    pair = await pause(served, "transfer $10 to a and $20 to b", "tok-alice")
    single = await pause(served, "transfer $40 to carol", "tok-bob")
    yes = {"respond": {"approved": True}}
    assert (await served.decide(f"{pair}:approval-1", yes, token=CAROL)).status_code == 200
    assert (await served.decide(f"{single}:approval-1", yes, token=CAROL)).status_code == 200

    for approval in (f"{pair}:approval-1", f"{single}:approval-1"):
        again = await served.decide(approval, {"respond": {"approved": False}}, token=CAROL)
        assert again.status_code == 409, again.text
        assert again.json()["status"] == "ABORTED"
        assert "no longer pending" in again.json()["message"]
    calls = {c.ref: c for c in await served.store.list_calls(pair)}
    assert calls["approval-1"].answer == {"respond": {"approved": True}}
    assert [t.toAccount for _key, t in served.app.transfers] == ["carol"]


async def test_a_decision_on_an_approval_answered_by_the_chat_is_a_409(served: Served) -> None:
    """Once the chat's own resume answered an interrupt, the inbox cannot decide it."""
    paused = await pause(served, "transfer $40 to carol", "tok-alice")
    resume = approval_resume({"snapshotId": paused}, True)
    chat = await served.http.post(served.agent_url, json=resume, headers=bearer("tok-alice"))
    assert chat.json()["result"]["finishReason"] == "stop", chat.text

    late = await served.decide(
        f"{paused}:approval-1", {"respond": {"approved": False}}, token=CAROL
    )

    assert late.status_code == 409, late.text
    assert late.json()["status"] == "ABORTED"
    assert len(served.app.transfers) == 1
    calls = await served.store.list_calls(paused)
    assert calls[0].answer == {"respond": {"approved": True}}
    assert calls[0].decided_by == "alice"


async def test_a_restart_decision_asks_again(served: Served) -> None:
    """A restart decision re-runs the interrupt: the resume pauses at a fresh open approval."""
    paused = await pause(served, "transfer $40 to carol", "tok-alice")

    reply = await served.decide(f"{paused}:approval-1", {"restart": True}, token=CAROL)

    assert reply.status_code == 200, reply.text
    again = reply.json()["resumeSnapshotId"]
    resumed = await served.snapshot(again, token="tok-alice")
    assert resumed["finishReason"] == "interrupted"
    assert served.app.transfers == []
    assert ids(await served.inbox(token=CAROL)) == [f"{again}:approval-1"]
    calls = await served.store.list_calls(paused)
    assert calls[0].answer == {"restart": True}
    assert calls[0].decided_by == "carol"


@pytest.mark.parametrize(
    "decision",
    [
        {"respond": {"approved": "yes"}},
        {"respond": {"feedback": "no approved field"}},
        {"respond": None},
        {"respond": {"approved": True}, "restart": True},
        {"restart": False},
        {},
        {"respond": {"approved": True}, "surprise": 1},
        {"restart": True, "resumed": {"x": 1}, "respond": 3},
    ],
)
async def test_an_invalid_decision_is_a_400_and_writes_nothing(
    served: Served, decision: dict[str, Any]
) -> None:
    """A decision that is not exactly one valid respond or restart is refused and not recorded."""
    paused = await pause(served, "transfer $40 to carol", "tok-alice")
    before = await served.store.list_calls(paused)
    rows_before = served.row_counts() if served.is_sql else None

    reply = await served.decide(f"{paused}:approval-1", decision, token=CAROL)

    assert reply.status_code == 400, reply.text
    assert reply.json()["status"] == "INVALID_ARGUMENT"
    assert await served.store.list_calls(paused) == before
    assert before[0].decided_at is None and before[0].answer is None
    if served.is_sql:
        row = served.sql(
            "SELECT status, answer, decided_by, decided_at FROM tool_calls WHERE turn_id = :t",
            t=paused,
        )
        assert [tuple(r) for r in row] == [("interrupted", None, None, None)]
        assert served.row_counts() == rows_before
    assert ids(await served.inbox(token=CAROL)) == [f"{paused}:approval-1"]


async def test_concurrent_decisions_on_one_approval_let_exactly_one_through(
    served: Served,
) -> None:
    """Ten simultaneous decisions on one approval: one 200, nine 409, one transfer."""
    paused = await pause(served, "transfer $40 to carol", "tok-alice")

    replies = await asyncio.gather(
        *(
            served.decide(f"{paused}:approval-1", {"respond": {"approved": True}}, token=CAROL)
            for _ in range(10)
        )
    )

    codes = sorted(r.status_code for r in replies)
    assert codes == [200] + [409] * 9, [r.text for r in replies]
    assert all(r.json()["status"] == "ABORTED" for r in replies if r.status_code == 409)
    assert len(served.app.transfers) == 1
    winner = next(r for r in replies if r.status_code == 200)
    resumed = await served.snapshot(winner.json()["resumeSnapshotId"], token="tok-alice")
    assert last_text(resumed) == "Done. Transaction txn-40-carol."


async def test_concurrent_decisions_on_both_approvals_of_a_turn_resume_it_once(
    served: Served,
) -> None:
    """The two approvals of one turn decided at the same moment: both 200, one resume."""
    paused = await pause(served, "transfer $10 to a and $20 to b", "tok-alice")

    replies = await asyncio.gather(
        served.decide(f"{paused}:approval-1", {"respond": {"approved": True}}, token=CAROL),
        served.decide(f"{paused}:approval-2", {"respond": {"approved": True}}, token="tok-alice"),
    )

    assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
    resumes = {r.json()["resumeSnapshotId"] for r in replies} - {None}
    assert len(resumes) == 1
    assert sorted(t.toAccount for _key, t in served.app.transfers) == ["a", "b"]
    resumed = await served.snapshot(resumes.pop(), token="tok-alice")
    assert resumed["finishReason"] == "stop"


async def test_with_a_worker_pool_a_decision_enqueues_the_resume_and_answers_at_once() -> None:
    """Queued execution: the last decision answers with the pending resume; a worker runs it."""
    async with (
        serve_banking(
            "postgres",
            auth=token_auth(),
            inbox_policy=RoleInboxPolicy("approver"),
            execution="workers",
        ) as served,
        WorkerPool(served.app.ai, served.store, poll_interval=0.05, scheduler=False),
    ):
        single = await pause(served, "transfer $40 to carol", "tok-alice")
        pair = await pause(served, "transfer $10 to a and $20 to b", "tok-bob")

        replies = await asyncio.gather(
            served.decide(f"{single}:approval-1", {"respond": {"approved": True}}, token=CAROL),
            served.decide(f"{pair}:approval-1", {"respond": {"approved": True}}, token=CAROL),
            served.decide(f"{pair}:approval-2", {"respond": {"approved": True}}, token="tok-bob"),
        )

        assert [r.status_code for r in replies] == [200, 200, 200], [r.text for r in replies]
        resumes = [r.json()["resumeSnapshotId"] for r in replies]
        assert resumes[0] is not None
        assert len({resumes[1], resumes[2]} - {None}) == 1  # the pair resumes once
        for resume_id, text in (
            (resumes[0], "Done. Transaction txn-40-carol."),
            (resumes[1] or resumes[2], "txn-20-b"),
        ):
            assert resume_id is not None
            for _ in range(200):
                token = "tok-alice" if resume_id == resumes[0] else "tok-bob"
                snapshot = await served.snapshot(resume_id, token=token)
                if snapshot["status"] != "pending":
                    break
                await asyncio.sleep(0.05)
            assert snapshot["status"] == "completed", snapshot
            assert text in last_text(snapshot)
    assert sorted(t.toAccount for _key, t in served.app.transfers) == ["a", "b", "carol"]


class AuditorsPolicy(OwnerInboxPolicy):
    """A permission hook narrower than any owner: everyone sees only auditAgent's approvals."""

    def owner_filter(self, principal: Principal | None) -> str | None:
        return None

    def can_decide(self, principal: Principal | None, approval: PendingApproval) -> bool:
        return approval.agent == AUDIT_AGENT


@pytest.mark.parametrize("kind", ["memory", "postgres"])
async def test_paging_under_a_permission_hook_has_no_gaps_and_no_empty_tail(kind: str) -> None:
    """Approvals the hook hides do not end the walk early, and the last page has no cursor."""
    async with serve_banking(kind, auth=token_auth(), inbox_policy=AuditorsPolicy()) as served:
        for n in range(3):
            await pause(served, f"transfer ${n + 1} to hidden{n}", "tok-alice")
        audited = [
            await pause(served, f"transfer ${n + 1} to seen{n}", "tok-bob", agent=AUDIT_AGENT)
            for n in range(3)
        ]
        walked: list[str] = []
        pages = 0
        cursor: str | None = None
        while pages < 20:
            params: dict[str, Any] = {"limit": 1 if pages % 2 else 2}
            if cursor is not None:
                params["cursor"] = cursor
            page = await served.inbox(token="tok-alice", **params)
            pages += 1
            walked.extend(ids(page))
            cursor = page["nextCursor"]
            if cursor is None:
                assert page["items"] or pages == 1, "an empty last page: the cursor promised more"
                break
        assert walked == [f"{turn}:approval-1" for turn in audited]
        # One page large enough for every row: all the visible ones, and no cursor.
        full = await served.inbox(token="tok-alice", limit=200)
        assert ids(full) == walked
        assert full["nextCursor"] is None
