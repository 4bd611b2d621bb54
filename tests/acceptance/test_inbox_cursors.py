"""The inbox's page cursors on real ``turnstile serve`` processes under a permission hook:
a cursor that lands on an approval the hook hides tells its reader nothing about it, cannot
be altered or made up, and works on every server process sharing the UI secret."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.acceptance.inbox_ui_auth import TOKENS
from tests.acceptance.inbox_ui_support import AUTH_SPEC, pause_transfer
from tests.databases import postgres_url
from tests.http_support import serve_process

pytestmark = pytest.mark.postgres

POLICY = "tests.acceptance.inbox_ui_auth:hides_alices_approvals"
SHARED = {"TURNSTILE_UI_SECRET": "cursor-acceptance-secret-0123456789abcdef"}


def owned_by(url: str, owner: str) -> list[str]:
    """The ids of the turns of ``owner``'s sessions."""
    database = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with database.connect() as db:
            query = sa.text(
                "SELECT t.id FROM turns t JOIN sessions s ON s.id = t.session_id "
                "WHERE s.owner = :owner"
            )
            return list(db.execute(query, {"owner": owner}).scalars())
    finally:
        database.dispose()


def inbox(base: str, **params: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {TOKENS['mallory']}"}
    return httpx.get(f"{base}/inbox", params=params, headers=headers, timeout=30)


def readable(cursor: str) -> str:
    """Whatever a reader gets by base64-decoding ``cursor`` (``""``: nothing)."""
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("latin-1")
    except (binascii.Error, ValueError):
        return ""


def test_a_cursor_on_a_hidden_approval_reveals_nothing_and_works_on_every_process() -> None:
    """Alice's approvals are hidden from everyone; a walk of one-item pages that alternates
    between two server processes sees exactly Bob's, although some cursors stop on Alice's,
    and no cursor holds her turn ids, in clear or base64. A cursor with one character
    changed, or sealed by a server with another secret, is a 400."""
    args = ["--auth", AUTH_SPEC, "--inbox-policy", POLICY]
    with (
        postgres_url() as url,
        serve_process(url, workers=1, args=args, env=SHARED) as (first, _a),
        serve_process(url, args=args, env=SHARED) as (second, _b),
    ):
        for n, who in enumerate(["alice", "alice", "bob", "alice", "alice", "bob"]):
            pause_transfer(first, who, n + 1)
        hidden = owned_by(url, "alice")
        assert len(hidden) == 4
        seen: list[str] = []
        cursors: list[str] = []
        params: dict[str, Any] = {"limit": 1}
        for step in range(20):
            page = inbox(first if step % 2 else second, **params)
            assert page.status_code == 200, page.text
            seen.extend(item["owner"] for item in page.json()["items"])
            cursor = page.json()["nextCursor"]
            if cursor is None:
                break
            cursors.append(cursor)
            params["cursor"] = cursor
        assert seen == ["bob", "bob"]
        assert len(cursors) >= 3
        for cursor in cursors:
            for turn_id in hidden:
                assert turn_id not in cursor and turn_id not in readable(cursor)
        altered = cursors[0][:-2] + ("A" if cursors[0][-2] != "A" else "B") + cursors[0][-1]
        assert inbox(first, cursor=altered).status_code == 400
    other = {"TURNSTILE_UI_SECRET": "another-acceptance-secret-0123456789abcdef"}
    with postgres_url() as url, serve_process(url, args=args, env=other) as (elsewhere, _c):
        refused = inbox(elsewhere, cursor=cursors[0])
        assert refused.status_code == 400
        assert "cursor" in refused.json()["message"]
