"""Hostile ids and misused inputs over real HTTP: a clear 4xx (or error frame), never a 500,
never a forged log line, and nothing written.

The server runs on PostgreSQL (uvicorn in the test's loop, turns inline), so "nothing written"
is checked by counting the rows of sessions, turns, messages and tool_calls, and log lines are
read from the records the real server emitted.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from starlette.requests import Request

from engine.remote.auth import Principal
from tests.http_fixtures import Served, bearer, serve_banking, token_auth

TURN = "/api/bankingAgent"
USER = {"role": "user", "content": [{"text": "transfer $40 to carol"}]}
HELLO = {"role": "user", "content": [{"text": "hello"}]}

#: 3,000 characters that do not compress (PostgreSQL compresses a repetitive key into its index).
LONG = "".join(uuid.uuid4().hex for _ in range(100))[:3000]
#: Ids no client should be able to send: too long, empty, or holding control characters.
HOSTILE_IDS = [
    ("3000 characters", LONG),
    ("empty", ""),
    ("newline", "evil\nFORGED line"),
    ("carriage return", "evil\rFORGED"),
    ("tab", "a\tb"),
    ("escape sequence", "red\x1b[31m"),
    ("DEL", "a\x7fb"),
    ("line separator", "a\u2028b"),
]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """The banking app on PostgreSQL, open (no auth), with one session paused at its approval."""
    async with serve_banking("postgres") as served:
        await served.send("transfer $40 to carol")
        yield served


def assert_refused(reply: httpx.Response, code: int, *, status: str, naming: str) -> None:
    """A ``code`` JSON error ``{status, message}`` whose message mentions ``naming``."""
    assert reply.status_code == code, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()
    assert error["status"] == status, error
    assert naming.lower() in error["message"].lower(), error["message"]


def frames(reply: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """The ``(field, payload)`` frames of a streamed turn."""
    assert reply.status_code == 200, reply.text
    parsed = []
    for raw in reply.text.split("\n\n"):
        if raw:
            field, _, body = raw.partition(": ")
            parsed.append((field, json.loads(body)))
    return parsed


def assert_error_frame(reply: httpx.Response, *, status: str, naming: str) -> None:
    """A stream of exactly one ``error:`` frame with ``status`` mentioning ``naming``."""
    [(field, payload)] = frames(reply)
    assert field == "error", payload
    assert payload["error"]["status"] == status, payload
    assert naming.lower() in payload["error"]["message"].lower(), payload


def cursor_of(key: Any) -> str:
    """A cursor as the server encodes one, holding ``key`` (a forged one, here)."""
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


class Collected(logging.Handler):
    """Every record the server logs, formatted as an operator's log file would show it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.extend(self.format(record).splitlines())


@contextlib.contextmanager
def server_log() -> Iterator[Collected]:
    """Collect the records of Turnstile's loggers (at INFO) and uvicorn's, while in the block."""
    collected = Collected()
    turnstile, uvicorn = logging.getLogger("turnstile"), logging.getLogger("uvicorn")
    level = turnstile.level
    turnstile.setLevel(logging.INFO)
    turnstile.addHandler(collected)
    uvicorn.addHandler(collected)
    try:
        yield collected
    finally:
        turnstile.removeHandler(collected)
        uvicorn.removeHandler(collected)
        turnstile.setLevel(level)


# -- (9) ids bounded in length and characters -----------------------------------------------


@pytest.mark.parametrize(("what", "hostile"), HOSTILE_IDS, ids=[c[0] for c in HOSTILE_IDS])
async def test_a_hostile_id_in_a_turn_or_snapshot_request_is_a_400(
    served: Served, what: str, hostile: str
) -> None:
    """A session or snapshot id that is too long, empty or holds a control character is a 400
    INVALID_ARGUMENT naming the field, on every route that takes one, and writes nothing."""
    before = served.row_counts()
    turns = [
        ({"data": {"message": USER}, "init": {"sessionId": hostile}}, "init.sessionId"),
        ({"data": {"message": HELLO}, "init": {"sessionId": hostile}}, "init.sessionId"),
        ({"data": {"message": USER}, "init": {"snapshotId": hostile}}, "init.snapshotId"),
        ({"data": {}, "init": {"snapshotId": hostile}}, "init.snapshotId"),
    ]
    for body, naming in turns:
        for accept in ("application/json", "text/event-stream"):
            reply = await served.http.post(served.url + TURN, json=body, headers={"accept": accept})
            assert_refused(reply, 400, status="INVALID_ARGUMENT", naming=naming)
    for path, data, naming in (
        ("/getSnapshot", {"snapshotId": hostile}, "data.snapshotId"),
        ("/getSnapshot", {"sessionId": hostile}, "data.sessionId"),
        ("/abort", {"snapshotId": hostile}, "data.snapshotId"),
    ):
        reply = await served.http.post(f"{served.url}{TURN}{path}", json={"data": data})
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming=naming)
    assert served.row_counts() == before
    assert served.app.transfers == []


@pytest.mark.parametrize(
    ("what", "hostile"),
    [c for c in HOSTILE_IDS if c[1]],  # an empty part is no approval id at all: a 404
    ids=[c[0] for c in HOSTILE_IDS if c[1]],
)
async def test_a_hostile_id_in_an_inbox_path_or_filter_is_a_400(
    served: Served, what: str, hostile: str
) -> None:
    """An inbox id whose turn id or ref is too long or holds a control character, and such an
    owner/agent/interrupt filter, is a 400 INVALID_ARGUMENT; nothing is decided."""
    [item] = (await served.http.get(f"{served.url}/inbox")).json()["items"]
    before = served.row_counts()
    for approval in (f"{hostile}:approval-1", f"{item['turnId']}:{hostile}"):
        path = f"{served.url}/inbox/{quote(approval, safe=':')}"
        assert_refused(await served.http.get(path), 400, status="INVALID_ARGUMENT", naming="id")
        reply = await served.http.post(f"{path}/decision", json={"respond": {"approved": True}})
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="id")
    for name in ("owner", "agent", "interrupt"):
        reply = await served.http.get(f"{served.url}/inbox", params={name: hostile})
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming=name)
    assert served.row_counts() == before
    rows = served.sql("SELECT answer, decided_at FROM tool_calls")
    assert [tuple(r) for r in rows] == [(None, None)]


async def test_a_cursor_hiding_a_lone_surrogate_or_a_hostile_id_is_a_400(served: Served) -> None:
    """A cursor that is (or decodes to) a lone surrogate, an overlong or a control-character id
    is a 400 INVALID_ARGUMENT naming the cursor, not a database error; so is one a client
    made up with ordinary ids, since cursors are sealed by the server."""
    [item] = (await served.http.get(f"{served.url}/inbox")).json()["items"]
    moment = item["createdAt"]
    forged = [
        cursor_of([moment, "\ud800", "approval-1"]),
        cursor_of([moment, item["turnId"], "a\udfffb"]),
        cursor_of([moment, LONG, "approval-1"]),
        cursor_of([moment, item["turnId"], "evil\nFORGED"]),
        cursor_of([moment, "", "approval-1"]),
        "A" * 10_000,
    ]
    for cursor in forged:
        reply = await served.http.get(f"{served.url}/inbox", params={"cursor": cursor})
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="cursor")
    # The raw bytes of a lone surrogate, percent-encoded straight into the query string.
    reply = await served.http.get(f"{served.url}/inbox?cursor=%ED%A0%80")
    assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="cursor")
    made_up = cursor_of([moment, item["turnId"], "approval-0"])
    reply = await served.http.get(f"{served.url}/inbox", params={"cursor": made_up})
    assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="cursor")


async def test_ids_within_the_bound_are_accepted(served: Served) -> None:
    """A client-chosen session id of exactly 200 printable characters (spaces, non-ASCII)
    still starts and continues a session."""
    chosen = ("session é/Ω " * 20)[:200]
    assert len(chosen) == 200
    first = await served.send("hello", init={"sessionId": chosen})
    assert first["sessionId"] == chosen
    again = await served.send("hello again", init={"sessionId": chosen})
    assert again["sessionId"] == chosen
    reply = await served.http.post(
        f"{served.url}{TURN}/getSnapshot", json={"data": {"sessionId": chosen}}
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["result"]["snapshotId"] == again["snapshotId"]


async def test_a_session_id_with_a_newline_forges_no_log_line(served: Served) -> None:
    """A sessionId holding a newline is refused before it reaches any log line, so the
    server log holds no line the client wrote."""
    with server_log() as log:
        body = {"data": {"message": HELLO}, "init": {"sessionId": "evil\nFORGED admin login"}}
        reply = await served.http.post(served.url + TURN, json=body)
        await served.send("hello")  # an ordinary turn, so the log is known to be collected
    assert any("created in session" in line for line in log.lines), log.lines
    assert not [line for line in log.lines if line.startswith("FORGED")], log.lines
    assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="init.sessionId")


async def test_a_crashing_plugin_logs_the_client_text_escaped() -> None:
    """When a plugin fails with the caller's text in its message, the request is a JSON 500
    and the logged traceback shows that text escaped, on no line of its own."""

    async def careless_auth(request: Request) -> Principal:
        # An authenticator with a bug, as a deployment could plug in: it echoes client text.
        raise RuntimeError(f"cannot parse user {request.query_params.get('user')}")

    async with serve_banking("postgres", auth=careless_auth) as served:
        with server_log() as log:
            reply = await served.http.get(
                f"{served.url}/inbox", params={"user": "evil\nFORGED admin login"}
            )
    assert not [line for line in log.lines if line.startswith("FORGED")], log.lines
    assert any("RuntimeError" in line and "evil\\nFORGED" in line for line in log.lines)
    assert reply.status_code == 500, reply.text
    assert reply.json() == {"status": "INTERNAL", "message": "Internal error."}


# -- (10) misuse Genkit throws on: an error, not a graceful result -------------------------


async def test_a_snapshot_of_another_session_is_an_error_not_a_failed_result(
    served: Served,
) -> None:
    """init.snapshotId of one session with init.sessionId of another is INVALID_ARGUMENT
    thrown as Genkit throws it (a 400, or an error frame when streaming), writing nothing."""
    [item] = (await served.http.get(f"{served.url}/inbox")).json()["items"]
    other = await served.send("hello")
    before = served.row_counts()
    mixed = {"snapshotId": item["turnId"], "sessionId": other["sessionId"]}
    respond = {
        "toolResponse": {"name": "userApproval", "ref": "approval-1", "output": {"approved": True}}
    }
    for data in ({"message": HELLO}, {"resume": {"respond": [respond]}}, {}):
        body = {"data": data, "init": mixed}
        reply = await served.http.post(served.url + TURN, json=body)
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="does not belong")
        streamed = await served.http.post(
            served.url + TURN, json=body, headers={"accept": "text/event-stream"}
        )
        assert_error_frame(streamed, status="INVALID_ARGUMENT", naming="does not belong")
    assert served.row_counts() == before
    assert served.app.transfers == []
    # The pair that does belong together still runs.
    matching = {"snapshotId": other["snapshotId"], "sessionId": other["sessionId"]}
    again = await served.send("hello again", init=matching)
    assert again["finishReason"] == "stop", again
    assert again["sessionId"] == other["sessionId"]


async def test_another_principals_snapshot_with_a_session_id_stays_not_found() -> None:
    """The mismatch check reveals nothing about another principal's snapshot: naming it with
    one's own session id is the same graceful NOT_FOUND as naming an unknown snapshot."""
    async with serve_banking("postgres", auth=token_auth()) as served:
        alices = await served.send("transfer $40 to carol", token="tok-alice")
        bobs = await served.send("hello", token="tok-bob")
        before = served.row_counts()
        for snapshot in (alices["snapshotId"], str(uuid.uuid4())):
            body = {
                "data": {"message": HELLO},
                "init": {"snapshotId": snapshot, "sessionId": bobs["sessionId"]},
            }
            reply = await served.http.post(served.url + TURN, json=body, headers=bearer("tok-bob"))
            assert reply.status_code == 200, reply.text
            result = reply.json()["result"]
            assert result["finishReason"] == "failed", result
            assert result["error"]["status"] == "NOT_FOUND", result
            assert "belong" not in result["error"]["message"]
        assert served.row_counts() == before


async def test_a_detach_only_input_starts_no_turn(served: Served) -> None:
    """data {"detach": true} with no message and no resume is INVALID_ARGUMENT (a 400, or an
    error frame when streaming): no turn starts, the model is not called, nothing is written."""
    done = await served.send("hello")
    before = served.row_counts()
    for init in ({}, {"snapshotId": done["snapshotId"]}, {"sessionId": done["sessionId"]}):
        body = {"data": {"detach": True}, "init": init}
        reply = await served.http.post(served.url + TURN, json=body)
        assert_refused(reply, 400, status="INVALID_ARGUMENT", naming="detach")
        streamed = await served.http.post(
            served.url + TURN, json=body, headers={"accept": "text/event-stream"}
        )
        assert_error_frame(streamed, status="INVALID_ARGUMENT", naming="detach")
    assert served.row_counts() == before
    # detach with a message still runs in the background; a plain retry is still a turn.
    body = {"data": {"message": HELLO, "detach": True}, "init": {"snapshotId": done["snapshotId"]}}
    detached = (await served.http.post(served.url + TURN, json=body)).json()["result"]
    assert detached["finishReason"] == "detached", detached
    for _ in range(200):  # let the background turn settle before the server stops
        if (await served.snapshot(detached["snapshotId"]))["status"] != "pending":
            break
        await asyncio.sleep(0.05)
    assert (await served.snapshot(detached["snapshotId"]))["status"] == "completed"
