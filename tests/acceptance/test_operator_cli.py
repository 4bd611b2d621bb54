"""The operator CLI's reads, as a shell user runs them: ``turns ls/show/timeline``,
``approvals ls/show``, ``stats`` and ``migrate --sql/current/history``, with their tables,
their ``--json`` shapes (docs/cli.md), their filters and their exit statuses, on PostgreSQL
and SQLite. Each command is a real ``turnstile`` process; a real worker process runs the
turns it reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stores.migrate import head_revision, migration_history
from tests.acceptance.operator_support import OperatorDatabase, operator_database

TURN_KEYS = {
    "id",
    "session_id",
    "agent",
    "parent_id",
    "status",
    "finish_reason",
    "input_kind",
    "attempts",
    "max_attempts",
    "error",
    "created_at",
    "updated_at",
    "settled_at",
    "age_seconds",
    "waiting_approvals",
}
CALL_KEYS = {
    "round",
    "ref",
    "name",
    "status",
    "input",
    "output",
    "error",
    "interrupt",
    "idempotency_key",
    "resumed",
    "answer",
    "decided_by",
    "decided_at",
    "started_at",
    "finished_at",
    "deadline",
    "created_at",
}
APPROVAL_KEYS = {
    "id",
    # What it asks in the approver's words (the code name and input without --app).
    "title",
    "summary",
    "turn_id",
    "session_id",
    "agent",
    "owner",
    "interrupt",
    "ref",
    "round",
    "input",
    "metadata",
    "deadline",
    "created_at",
    "age_seconds",
    "app_version",
    # Who holds it (docs/cli.md, "approvals ls"): null for an approval nobody assigned.
    "assignee",
    "group",
    "assigned_by",
    "assigned_at",
    "escalated_at",
    "escalated_from_assignee",
    "escalated_from_group",
    "escalated_to",
    "reminders",
    "last_reminded_at",
    "escalation_step",
}


@pytest.fixture(params=["postgres", "sqlite"])
async def seeded(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[OperatorDatabase, dict[str, str]]]:
    """A database holding three settled turns a worker ran: an echo (completed), a transfer
    paused at its approval, and a failure."""
    async with operator_database(request.param, tmp_path) as db:
        with db.worker():
            ids = {
                "echo": await db.send("hello operators"),
                "paused": await db.send("transfer $40 to carol"),
                "failed": await db.send("please fail"),
            }
            await db.settled(3, statuses=("completed", "failed"))
        yield db, ids


async def test_turns_ls_lists_filters_and_prints_its_json_shape(
    seeded: tuple[OperatorDatabase, dict[str, str]],
) -> None:
    db, ids = seeded
    done = await db.run_cli("turns", "ls", "--json")
    assert done.status == 0, done.err
    items = done.json()["items"]
    assert [set(item) for item in items] == [TURN_KEYS] * 3
    by_id = {item["id"]: item for item in items}
    assert by_id[ids["echo"]]["status"] == "completed"
    assert by_id[ids["echo"]]["finish_reason"] == "stop"
    assert by_id[ids["failed"]]["status"] == "failed"
    assert by_id[ids["failed"]]["error"] == {
        "status": "INTERNAL",
        "message": "Scripted model failure",
    }
    paused = by_id[ids["paused"]]
    assert (paused["status"], paused["finish_reason"]) == ("completed", "interrupted")
    assert paused["waiting_approvals"] == [
        {
            "id": f"{ids['paused']}:approval-1",
            "interrupt": "userApproval",
            "ref": "approval-1",
            "created_at": paused["waiting_approvals"][0]["created_at"],
        }
    ]
    assert [item["created_at"] for item in items] == sorted(
        (item["created_at"] for item in items), reverse=True
    )

    only_paused = (await db.run_cli("turns", "ls", "--status", "paused", "--json")).json()
    assert [item["id"] for item in only_paused["items"]] == [ids["paused"]]
    failed_or_paused = await db.run_cli(
        "turns", "ls", "--status", "failed", "--status", "paused", "--json"
    )
    assert {item["id"] for item in failed_or_paused.json()["items"]} == {
        ids["paused"],
        ids["failed"],
    }
    session = paused["session_id"]
    in_session = (await db.run_cli("turns", "ls", "--session", session, "--json")).json()
    assert [item["id"] for item in in_session["items"]] == [ids["paused"]]
    assert len((await db.run_cli("turns", "ls", "--since", "1h", "--json")).json()["items"]) == 3
    future = await db.run_cli("turns", "ls", "--since", "2999-01-01T00:00:00Z", "--json")
    assert future.json() == {"items": []}
    assert (await db.run_cli("turns", "ls", "--agent", "nobody", "--json")).json() == {"items": []}
    assert len((await db.run_cli("turns", "ls", "--limit", "1", "--json")).json()["items"]) == 1

    table = await db.run_cli("turns", "ls", "--wide")
    assert table.status == 0, table.err
    assert "ID" in table.out and "WAITING" in table.out
    for turn_id in ids.values():
        assert turn_id in table.out
    paused_line = next(line for line in table.out.splitlines() if ids["paused"] in line)
    assert "paused" in paused_line and "userApproval approval-1" in paused_line


async def test_turns_show_and_timeline(seeded: tuple[OperatorDatabase, dict[str, str]]) -> None:
    db, ids = seeded
    done = await db.run_cli("turns", "show", ids["paused"], "--json")
    assert done.status == 0, done.err
    shown = done.json()
    assert set(shown) == {"turn", "conversation", "rounds", "tool_calls", "timeline"}
    turn = shown["turn"]
    assert set(turn) >= TURN_KEYS | {"input", "lease_owner", "run_after", "children"}
    assert turn["input"]["kind"] == "message"
    assert [m["role"] for m in shown["conversation"]] == ["user", "model"]
    assert [(r["round"], r["committed"]) for r in shown["rounds"]] == [(0, True), (1, True)]
    [call] = shown["tool_calls"]
    assert set(call) == CALL_KEYS
    assert (call["name"], call["status"]) == ("userApproval", "interrupted")
    assert call["idempotency_key"] == f"{ids['paused']}:approval-1"

    human = await db.run_cli("turns", "show", ids["paused"])
    assert human.status == 0, human.err
    assert "paused (interrupted)" in human.out
    assert "user: transfer $40 to carol" in human.out
    assert "Tool calls" in human.out and f"{ids['paused']}:approval-1" in human.out
    failed = await db.run_cli("turns", "show", ids["failed"])
    assert "INTERNAL: Scripted model failure" in failed.out

    timeline = await db.run_cli("turns", "timeline", ids["paused"], "--json")
    assert timeline.status == 0, timeline.err
    entries = timeline.json()["items"]
    assert all(set(e) == {"at", "kind", "attempt", "actor", "detail"} for e in entries)
    assert entries[0] == {
        "at": entries[0]["at"],
        "kind": "status",
        "attempt": 0,
        "actor": None,
        "detail": "new -> pending",
    }
    assert ("paused", 1, "userApproval approval-1") in {
        (e["kind"], e["attempt"], e["detail"]) for e in entries
    }
    assert shown["timeline"] == entries
    assert entries[-1]["detail"] == "pending -> completed"
    assert [e["at"] for e in entries] == sorted(e["at"] for e in entries)
    human_timeline = await db.run_cli("turns", "timeline", ids["paused"])
    assert "new -> pending" in human_timeline.out and "paused" in human_timeline.out

    for command in ("show", "timeline"):
        missing = await db.run_cli("turns", command, "no-such-turn")
        assert missing.status == 1
        assert "no turn 'no-such-turn'" in missing.err and "turnstile turns ls" in missing.err
        assert "Traceback" not in missing.err


async def test_approvals_ls_and_show(seeded: tuple[OperatorDatabase, dict[str, str]]) -> None:
    db, ids = seeded
    approval = f"{ids['paused']}:approval-1"
    done = await db.run_cli("approvals", "ls", "--json")
    assert done.status == 0, done.err
    [item] = done.json()["items"]
    assert set(item) == APPROVAL_KEYS
    assert item["id"] == approval
    assert item["input"] == {"action": "transferMoney", "details": "Transfer $40 to carol"}
    assert (await db.run_cli("approvals", "ls", "--older-than", "1d", "--json")).json() == {
        "items": []
    }
    by_interrupt = await db.run_cli("approvals", "ls", "--interrupt", "userApproval", "--json")
    assert len(by_interrupt.json()["items"]) == 1
    by_agent = await db.run_cli("approvals", "ls", "--agent", "otherAgent", "--json")
    assert by_agent.json() == {"items": []}
    table = await db.run_cli("approvals", "ls", "--wide")
    assert approval in table.out and "userApproval" in table.out

    shown = await db.run_cli("approvals", "show", approval, "--json")
    assert shown.status == 0, shown.err
    body = shown.json()
    assert set(body) == {"approval", "call", "siblings", "conversation"}
    assert body["approval"]["state"] == "open" and body["approval"]["open"] is True
    assert body["call"] == {
        "name": "userApproval",
        "ref": "approval-1",
        "input": {"action": "transferMoney", "details": "Transfer $40 to carol"},
    }
    assert [m["content"][0]["text"] for m in body["conversation"]] == ["transfer $40 to carol"]
    human = await db.run_cli("approvals", "show", approval)
    assert "Paused call" in human.out and "Transfer $40 to carol" in human.out
    assert "user: transfer $40 to carol" in human.out

    for unknown in (f"{ids['paused']}:approval-9", "not-an-approval-id"):
        missing = await db.run_cli("approvals", "show", unknown)
        assert missing.status == 1, missing
        assert "turnstile approvals ls" in missing.err


async def test_ls_tables_lead_with_what_each_row_is_about(
    seeded: tuple[OperatorDatabase, dict[str, str]],
) -> None:
    """Without --wide, a turn and an approval are listed by their short ids, with what the
    approval asks and what the failure was."""
    db, ids = seeded
    turns = await db.run_cli("turns", "ls")
    assert turns.status == 0, turns.err
    paused_line = next(line for line in turns.out.splitlines() if ids["paused"][:8] in line)
    assert "paused" in paused_line and "userApproval: Transfer $40 to carol" in paused_line
    assert "INTERNAL: Scripted model failure" in turns.out
    approvals = await db.run_cli("approvals", "ls")
    assert approvals.status == 0, approvals.err
    assert f"{ids['paused'][:8]}:approval-1" in approvals.out
    assert "userApproval: Transfer $40 to carol" in approvals.out


async def test_stats(seeded: tuple[OperatorDatabase, dict[str, str]]) -> None:
    db, _ids = seeded
    done = await db.run_cli("stats", "--json")
    assert done.status == 0, done.err
    stats = done.json()
    assert set(stats) == {
        "at",
        "turns",
        "estimated",
        "analyzed_at",
        "paused",
        "queue",
        "oldest_pending",
        "approvals",
        "versions",
    }
    assert stats["turns"] == {
        "pending": 0,
        "aborting": 0,
        "completed": 2,
        "failed": 1,
        "aborted": 0,
    }
    # A table this new was never analyzed (PostgreSQL) or is SQLite: every count is exact.
    assert (stats["estimated"], stats["analyzed_at"]) == ([], None)
    exact = await db.run_cli("stats", "--json", "--exact")
    assert exact.status == 0, exact.err
    assert exact.json()["turns"] == stats["turns"] and exact.json()["estimated"] == []
    assert stats["paused"] == 1
    assert stats["queue"] == {"claimable": 0, "backing_off": 0, "running": 0, "aborting": 0}
    assert stats["oldest_pending"] is None
    approvals = stats["approvals"]
    assert approvals["open"] == 1 and approvals["decided_waiting"] == 0
    assert approvals["by_age"] == {"<1h": 1, "1h-1d": 0, "1d-7d": 0, ">=7d": 0}

    queued = await db.send("hello again")  # no worker runs now: it stays pending
    stats = (await db.run_cli("stats", "--json")).json()
    assert stats["turns"]["pending"] == 1 and stats["queue"]["claimable"] == 1
    assert stats["oldest_pending"]["turn_id"] == queued
    # One agent, one version (its tools version): the paused and the queued turn.
    [version] = stats["versions"]
    assert (version["claimable"], version["paused"]) == (1, 1)
    assert version["version"].startswith("tools-")
    human = await db.run_cli("stats")
    assert "Turns" in human.out and "Open approvals by age" in human.out
    assert f"Oldest pending turn: {queued}" in human.out


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_migrate_sql_current_and_history(kind: str, tmp_path: Path) -> None:
    head = head_revision()
    revisions = [m.revision for m in migration_history()]
    assert head == revisions[-1] and len(revisions) >= 5
    async with operator_database(kind, tmp_path) as db:
        current = await db.run_cli("migrate", "current")
        assert (current.status, current.out.strip()) == (0, f"{head} (head)"), current.err
        assert (await db.run_cli("migrate", "current", "--json")).json() == {
            "current": head,
            "head": head,
            "at_head": True,
        }
        history = (await db.run_cli("migrate", "history", "--json")).json()
        assert history["head"] == head
        assert [m["revision"] for m in history["items"]] == revisions
        assert all(m["applied"] is True for m in history["items"])
        assert history["items"][0]["down_revision"] is None
        assert "trace" in history["items"][4]["description"]

        at_head = await db.run_cli("migrate", "--sql")
        assert (at_head.status, at_head.out) == (0, "")
        assert "at head already" in at_head.err
        everything = await db.run_cli("migrate", "--sql", "--from", "base")
        assert everything.status == 0, everything.err
        assert "CREATE TABLE turns" in everything.out
        assert "CREATE VIEW turn_timeline" in everything.out
        last = await db.run_cli("migrate", "--sql", "--from", revisions[-2])
        assert f"version_num='{head}'" in last.out and "CREATE TABLE turns" not in last.out
        unknown = await db.run_cli("migrate", "--sql", "--from", "0999")
        assert unknown.status == 2 and "--from 0999" in unknown.err
        # Nothing of it was applied: the database is where it was.
        assert (await db.run_cli("migrate", "current")).out.strip() == f"{head} (head)"


async def test_migrate_current_of_an_empty_database_and_migrate_itself(tmp_path: Path) -> None:
    head = head_revision()
    async with operator_database("sqlite", tmp_path) as db:
        db.url = f"sqlite:///{tmp_path / 'empty.db'}"
        before = await db.run_cli("migrate", "current")
        assert before.out.strip() == (
            f"empty (never migrated); head is {head}: run `turnstile migrate`"
        )
        pending = (await db.run_cli("migrate", "history", "--json")).json()
        assert {m["applied"] for m in pending["items"]} == {False}
        sql = await db.run_cli("migrate", "--sql")
        assert "CREATE TABLE sessions" in sql.out
        migrated = await db.run_cli("migrate", "--log-level", "warning")
        assert migrated.status == 0 and "database at head" in migrated.out
        assert (await db.run_cli("migrate", "current")).out.strip() == f"{head} (head)"
