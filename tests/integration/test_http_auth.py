"""Authentication and ownership over real HTTP.

Bearer tokens: alice and bob own sessions; carol holds the ``approver`` role. Sessions belong
to the principal that created them; another principal's turn, getSnapshot, abort and inbox
requests are refused as if the session did not exist. Every test runs on the in-memory
store and on PostgreSQL, where "nothing changes" is checked by counting rows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine.errors import NotFoundError
from engine.remote.auth import InboxPolicy, RoleInboxPolicy
from engine.remote.client import remote_agent
from tests.http_fixtures import Served, approval_resume, bearer, serve_banking, token_auth

ALICE, BOB, CAROL = "tok-alice", "tok-bob", "tok-carol"


async def _serve(kind: str, policy: InboxPolicy | None) -> AsyncIterator[Served]:
    async with serve_banking(kind, auth=token_auth(), inbox_policy=policy) as served:
        yield served


@pytest.fixture(params=["memory", "postgres"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """The banking app behind bearer tokens, with the default inbox policy (own sessions)."""
    async for one in _serve(request.param, None):
        yield one


@pytest.fixture(params=["memory", "postgres"])
async def with_approvers(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    """The same, but the ``approver`` role may see and decide every approval."""
    async for one in _serve(request.param, RoleInboxPolicy("approver")):
        yield one


@pytest.fixture
async def on_postgres() -> AsyncIterator[Served]:
    """The banking app behind bearer tokens on PostgreSQL only (for SQL checks)."""
    async for one in _serve("postgres", None):
        yield one


async def state_of(served: Served) -> Any:
    """Everything a refused request must leave alone: rows (SQL) or the listed approvals."""
    if served.is_sql:
        return served.row_counts()
    page = await served.inbox(token=ALICE)
    return [item["id"] for item in page["items"]]


TURN = {"data": {"message": {"role": "user", "content": [{"text": "transfer $1 to x"}]}}}
ROUTES: list[tuple[str, str, Any]] = [
    ("POST", "/api/bankingAgent", {**TURN, "init": {}}),
    ("POST", "/api/bankingAgentStateless", {**TURN, "init": {}}),
    ("POST", "/api/noSuchAgent", {**TURN, "init": {}}),
    ("POST", "/api/bankingAgent/getSnapshot", {"data": {"snapshotId": "s"}}),
    ("POST", "/api/bankingAgent/abort", {"data": {"snapshotId": "s"}}),
    ("GET", "/inbox", None),
    ("GET", "/inbox/turn:approval-1", None),
    ("POST", "/inbox/turn:approval-1/decision", {"respond": {"approved": True}}),
]
BAD_HEADERS: list[dict[str, str]] = [
    {},
    {"authorization": "Bearer tok-mallory"},
    {"authorization": "Bearer"},
    {"authorization": "Basic dG9rLWFsaWNlOg=="},
    {"authorization": "tok-alice"},
    {"authorization": "Bearer tok-alice-but-longer"},
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
async def test_every_route_refuses_a_missing_or_bad_token_with_401(
    served: Served, method: str, path: str, body: Any
) -> None:
    """Without a valid bearer token every route answers 401 with a JSON error and a bearer
    challenge (WWW-Authenticate), writing nothing."""
    await served.send("transfer $40 to carol", token=ALICE)
    before = await state_of(served)
    for headers in BAD_HEADERS:
        for accept in ({}, {"accept": "text/event-stream"}):
            reply = await served.http.request(
                method, served.url + path, json=body, headers={**headers, **accept}
            )
            assert reply.status_code == 401, (headers, reply.text)
            error = reply.json()
            assert error["status"] == "UNAUTHENTICATED"
            assert "token" in error["message"].lower()
            assert reply.headers["www-authenticate"] == 'Bearer realm="turnstile"'
    assert await state_of(served) == before
    assert served.app.transfers == []


async def test_another_principals_session_looks_unknown_and_stays_unchanged(
    served: Served,
) -> None:
    """bob's send, resume, getSnapshot, abort, show and decision on alice's session are refused
    as NOT_FOUND (an abort answers without a status, as Genkit's does), exactly as for a
    session that does not exist, and change nothing."""
    paused = await served.send("transfer $40 to carol", token=ALICE)
    snapshot_id, session_id = paused["snapshotId"], paused["sessionId"]
    before = await state_of(served)
    agent = served.agent_url
    message = {"message": {"role": "user", "content": [{"text": "transfer $99 to bob"}]}}
    respond = {
        "resume": {
            "respond": [
                {
                    "toolResponse": {
                        "name": "userApproval",
                        "ref": "approval-1",
                        "output": {"approved": True},
                    }
                }
            ]
        }
    }
    turns = [
        {"data": message, "init": {"snapshotId": snapshot_id}},
        {"data": message, "init": {"sessionId": session_id}},
        {"data": respond, "init": {"snapshotId": snapshot_id}},
        {"data": {}, "init": {"snapshotId": snapshot_id}},
    ]
    for body in turns:
        # Genkit's protocol: a refused turn is a failed *result* (HTTP 200), typed NOT_FOUND.
        reply = await served.http.post(agent, json=body, headers=bearer(BOB))
        assert reply.status_code == 200, reply.text
        result = reply.json()["result"]
        assert result["finishReason"] == "failed"
        assert result["error"]["status"] == "NOT_FOUND", result
        assert "snapshotId" not in result and "sessionId" not in result
    refusals = [
        ("/api/bankingAgent/getSnapshot", {"data": {"snapshotId": snapshot_id}}),
        ("/api/bankingAgent/getSnapshot", {"data": {"sessionId": session_id}}),
        (f"/inbox/{snapshot_id}:approval-1/decision", {"respond": {"approved": True}}),
    ]
    for path, body in refusals:
        reply = await served.http.post(served.url + path, json=body, headers=bearer(BOB))
        assert reply.status_code == 404, (path, reply.text)
        assert reply.json()["status"] == "NOT_FOUND"
        # The same answer as for an id nobody has: nothing tells bob the session exists.
        unknown = await served.http.post(
            served.url + path.replace(snapshot_id, "nobodys-snapshot"),
            json=_swap(body, {snapshot_id: "nobodys-snapshot", session_id: "nobodys-session"}),
            headers=bearer(BOB),
        )
        assert unknown.status_code == 404
        assert (
            reply.json()["message"]
            .replace(snapshot_id, "nobodys-snapshot")
            .replace(session_id, "nobodys-session")
            == unknown.json()["message"]
        )
    # Genkit's abort of a snapshot it does not hold: no status, the same as for nobody's.
    for target in (snapshot_id, "nobodys-snapshot"):
        aborted = await served.http.post(
            f"{agent}/abort", json={"data": {"snapshotId": target}}, headers=bearer(BOB)
        )
        assert aborted.status_code == 200, aborted.text
        assert aborted.json() == {"result": {"snapshotId": target}}
    shown = await served.http.get(
        f"{served.url}/inbox/{snapshot_id}:approval-1", headers=bearer(BOB)
    )
    assert shown.status_code == 404
    assert shown.json()["status"] == "NOT_FOUND"

    assert await state_of(served) == before
    assert served.app.transfers == []
    still = await served.snapshot(snapshot_id, token=ALICE)
    assert (still["status"], still["finishReason"]) == ("completed", "interrupted")
    mine = await served.inbox(token=ALICE)
    assert [i["id"] for i in mine["items"]] == [f"{snapshot_id}:approval-1"]


def _swap(body: Any, replacements: dict[str, str]) -> Any:
    if isinstance(body, dict):
        return {k: _swap(v, replacements) for k, v in body.items()}
    if isinstance(body, str):
        return replacements.get(body, body)
    return body


async def test_the_remote_client_raises_not_found_for_another_principals_session(
    served: Served,
) -> None:
    """Through the Python remote client, bob gets typed NotFoundErrors on alice's session."""
    async with (
        remote_agent(served.agent_url, headers=bearer(ALICE)) as alices,
        remote_agent(served.agent_url, headers=bearer(BOB)) as bobs,
    ):
        response = await alices.chat().send("transfer $40 to carol")
        assert [i.ref for i in response.interrupts] == ["approval-1"]
        snapshot_id = response.snapshot_id
        assert snapshot_id is not None
        before = await state_of(served)

        with pytest.raises(NotFoundError):
            await bobs.chat(snapshot_id=snapshot_id).send("transfer $99 to bob")
        with pytest.raises(NotFoundError):
            await bobs.chat(session_id=response.session_id).send("hello")
        with pytest.raises(NotFoundError):
            await bobs.chat(snapshot_id=snapshot_id).resume(
                respond=[response.interrupts[0].respond({"approved": True})]
            )
        assert await bobs.abort(snapshot_id) is None
        assert await bobs.get_snapshot(snapshot_id=snapshot_id) is None
        assert await bobs.get_snapshot(session_id=response.session_id) is None

        assert await state_of(served) == before
        mine = await alices.get_snapshot(snapshot_id=snapshot_id)
        assert mine is not None and mine.snapshot_id == snapshot_id
    assert served.app.transfers == []


async def test_the_inbox_lists_only_ones_own_approvals_by_default(served: Served) -> None:
    """With the default policy each principal lists and decides only its own sessions' approvals."""
    alices = (await served.send("transfer $40 to carol", token=ALICE))["snapshotId"]
    bobs = (await served.send("transfer $15 to dave", token=BOB))["snapshotId"]

    async def listed(token: str, **params: Any) -> list[str]:
        return [i["id"] for i in (await served.inbox(token=token, **params))["items"]]

    assert await listed(ALICE) == [f"{alices}:approval-1"]
    assert await listed(BOB) == [f"{bobs}:approval-1"]
    assert await listed(CAROL) == []  # the role means nothing to the default policy
    assert await listed(ALICE, owner="bob") == []
    assert await listed(ALICE, owner="alice") == [f"{alices}:approval-1"]

    refused = await served.decide(
        f"{bobs}:approval-1", {"respond": {"approved": True}}, token=CAROL
    )
    assert refused.status_code == 404
    own = await served.decide(f"{bobs}:approval-1", {"respond": {"approved": True}}, token=BOB)
    assert own.status_code == 200, own.text
    assert own.json()["decidedBy"] == "bob"
    assert [t.toAccount for _key, t in served.app.transfers] == ["dave"]


async def test_an_approver_role_lists_and_decides_everyones_approvals(
    with_approvers: Served,
) -> None:
    """With RoleInboxPolicy('approver') carol lists and decides every session's approvals."""
    served = with_approvers
    alices = (await served.send("transfer $40 to carol", token=ALICE))["snapshotId"]
    bobs = (await served.send("transfer $15 to dave", token=BOB))["snapshotId"]

    everyone = await served.inbox(token=CAROL)
    assert [i["id"] for i in everyone["items"]] == [f"{alices}:approval-1", f"{bobs}:approval-1"]
    only_bob = await served.inbox(token=CAROL, owner="bob")
    assert [i["id"] for i in only_bob["items"]] == [f"{bobs}:approval-1"]
    assert [i["id"] for i in (await served.inbox(token=ALICE))["items"]] == [f"{alices}:approval-1"]
    shown = await served.http.get(f"{served.url}/inbox/{bobs}:approval-1", headers=bearer(CAROL))
    assert shown.status_code == 200
    assert (
        await served.http.get(f"{served.url}/inbox/{bobs}:approval-1", headers=bearer(ALICE))
    ).status_code == 404

    decided = await served.decide(
        f"{bobs}:approval-1", {"respond": {"approved": True}}, token=CAROL
    )

    assert decided.status_code == 200, decided.text
    assert decided.json()["decidedBy"] == "carol"
    assert [t.toAccount for _key, t in served.app.transfers] == ["dave"]
    resumed = await served.snapshot(decided.json()["resumeSnapshotId"], token=BOB)
    assert resumed["finishReason"] == "stop"
    # carol decided, but the session (and its resume) still belongs to bob.
    forbidden = await served.http.post(
        f"{served.agent_url}/getSnapshot",
        json={"data": {"snapshotId": decided.json()["resumeSnapshotId"]}},
        headers=bearer(CAROL),
    )
    assert forbidden.status_code == 404


async def test_sessions_record_their_owner_in_sql(on_postgres: Served) -> None:
    """Each session row names the principal that created it; a resume does not change it."""
    served = on_postgres
    alices = await served.send("transfer $40 to carol", token=ALICE)
    bobs = await served.send("hello", token=BOB)
    await served.send("and again", token=BOB, init={"snapshotId": bobs["snapshotId"]})

    rows = served.sql("SELECT id, owner FROM sessions ORDER BY owner")

    assert [(r.id, r.owner) for r in rows] == [
        (alices["sessionId"], "alice"),
        (bobs["sessionId"], "bob"),
    ]
    turns = served.sql("SELECT count(*) FROM turns WHERE session_id = :s", s=bobs["sessionId"])
    assert turns[0][0] == 2


async def test_an_open_server_without_auth_still_serves_everyone() -> None:
    """Without an authenticator the server is open (local use): no token needed anywhere."""
    async with serve_banking("memory") as served:
        paused = await served.send("transfer $40 to carol")
        assert (await served.inbox())["items"][0]["owner"] is None
        reply = await served.decide(
            f"{paused['snapshotId']}:approval-1", {"respond": {"approved": True}}
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["decidedBy"] is None
    assert len(served.app.transfers) == 1


async def test_a_client_managed_agent_continues_under_an_authenticator(served: Served) -> None:
    """Behind bearer tokens, a client-managed turn resumes from its untouched signed state:
    the rebuilt session is the requester's own, not an unknown one."""
    paused = await served.send("transfer $40 to carol", token=ALICE, agent="bankingAgentStateless")
    assert paused["finishReason"] == "interrupted", paused
    resume = approval_resume({"state": paused["state"]}, True)
    for token in (ALICE, BOB):
        reply = await served.http.post(
            f"{served.url}/api/bankingAgentStateless", json=resume, headers=bearer(token)
        )
        result = reply.json()["result"]
        assert result["finishReason"] == "stop", reply.text
        assert "Done. Transaction txn-40-carol." in result["message"]["content"][0]["text"]
    assert len({key for key, _ in served.app.transfers}) == 1
