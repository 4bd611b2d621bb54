"""The example queries of docs/schema.md run against real turns and return what they claim."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine import TurnFailedError
from examples.banking import build
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import libpq_dsn, postgres_url

DOC = Path(__file__).resolve().parents[2] / "docs" / "schema.md"


def documented_queries() -> list[str]:
    """The ```sql blocks of docs/schema.md."""
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


@pytest.fixture(scope="module")
def populated() -> Any:
    """A PostgreSQL database with a paused, an approved and a failed banking turn."""
    import asyncio

    with postgres_url() as url:

        async def play() -> dict[str, str]:
            store = SqlSessionStore(url)
            app = build(store=store, state_keys=TEST_STATE_KEYS, execution="inline", max_attempts=1)
            agent = app.banking_agent
            paused = await agent.chat().send("Transfer $500 to my savings account.")
            chat = agent.chat()
            first = await chat.send("Transfer $50 to Alice")
            approved = await chat.resume(respond=[first.interrupts[0].respond({"approved": True})])
            with contextlib.suppress(TurnFailedError):
                await agent.chat().send("this will fail")
            await store.close()
            return {"paused": str(paused.snapshot_id), "approved": str(approved.snapshot_id)}

        ids = asyncio.run(play())
        yield url, ids


def run(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Run one documented query (``:name`` placeholders) with psycopg."""
    dsn = libpq_dsn(url)
    text = re.sub(r":(\w+)", r"%(\1)s", sql)
    with psycopg.connect(dsn) as connection:
        return connection.execute(text, params).fetchall()


def test_every_documented_query_runs(populated: Any) -> None:
    """Each ```sql block of docs/schema.md executes without error."""
    url, ids = populated
    queries = documented_queries()
    assert len(queries) >= 8
    for sql in queries:
        run(url, sql, turn_id=ids["approved"])


def test_open_approvals_lists_the_paused_transfer(populated: Any) -> None:
    """open_approvals shows the one unanswered approval with its details and age."""
    url, _ = populated
    rows = run(url, documented_queries()[0])
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("bankingAgent", "userApproval", "approval-1", "Transfer $500 to my savings account")
    ]
    assert rows[0][4] >= 0


def test_timeline_tells_the_story_of_an_approved_turn(populated: Any) -> None:
    """The timeline of the resumed turn shows its claim, the transfer and settlement, each
    with the attempt and the worker that ran it."""
    url, ids = populated
    rows = run(url, documented_queries()[2], turn_id=ids["approved"])
    kinds = [r[1] for r in rows]
    details = " | ".join(r[4] for r in rows)
    assert "claimed" in kinds and "tool started" in kinds and "tool done" in kinds
    assert "transferMoney transfer-1" in details
    assert "pending -> completed" in details
    [worker] = {r[3] for r in rows if r[1] == "claimed"}
    assert {(r[2], r[3]) for r in rows if r[1].startswith("tool")} == {(1, worker)}


def test_decisions_and_failures_are_queryable(populated: Any) -> None:
    """The audit of decisions shows the approval; failed turns show their error."""
    url, _ = populated
    queries = documented_queries()
    decisions = run(url, queries[4])
    assert [(r[1], r[2], r[3]) for r in decisions] == [
        ("userApproval", "approval-1", {"respond": {"approved": True}})
    ]
    failures = run(url, queries[6])
    assert [(r[2], r[3]) for r in failures] == [("INTERNAL", "Scripted model failure")]
    executed = run(url, queries[7])
    assert [(r[1], r[4]) for r in executed] == [("transferMoney", "done")]
