"""A turn's history with real worker processes on real PostgreSQL (issue 32): a worker
SIGKILLed mid-transfer and another reclaiming the turn after the lease expired both stay on
the timeline, as ``turnstile turns timeline`` / ``turns show``, the SQL view ``turn_timeline``
and the turn inspector in Debian's Chromium (against a real ``turnstile serve``) tell it, with
the pause and the decision before them at their own times."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest

from engine.approvals.decide import Decision, decide
from engine.store import ApprovalQuery
from tests.acceptance.durable_support import APP_SPEC, Cluster
from tests.acceptance.inbox_ui_support import launch_chromium, new_page
from tests.acceptance.test_cli_tables import run

# `cluster` is the fixture: a fresh database whose workers are killed at teardown.
from tests.acceptance.test_durable_workers import cluster, paused_transfer  # noqa: F401
from tests.http_support import serve_process


def timeline_of(db: Cluster, turn_id: str) -> list[dict[str, Any]]:
    """``turnstile turns timeline ID --json``'s entries."""
    done = run(db.url, "turns", "timeline", turn_id, "--json")
    assert done.status == 0, done.err
    items: list[dict[str, Any]] = done.json()["items"]  # type: ignore[index]
    return items


def story(entries: list[dict[str, Any]]) -> list[tuple[str, int | None, str | None, str]]:
    """(kind, attempt, actor, detail) of each entry, in order."""
    return [(e["kind"], e["attempt"], e["actor"], e["detail"]) for e in entries]


def inspector_rows(db: Cluster, turn_id: str) -> list[tuple[str, str, str, str]]:
    """(what, attempt, by, detail) of each row of the turn inspector's timeline, as Chromium
    shows it from a ``turnstile serve`` on the cluster's database (no sign-in: no --auth)."""
    with (
        serve_process(db.url, app=APP_SPEC) as (base, _server),
        launch_chromium() as browser,
        new_page(browser) as page,
    ):
        page.goto(f"{base}/ui/turns/{turn_id}")
        cells = page.locator("#timeline tbody tr").evaluate_all(
            "rows => rows.map(row => [...row.cells].map(cell => cell.innerText.trim()))"
        )
    return [(what, attempt, by, detail) for _when, what, attempt, by, detail in cells]


@pytest.mark.timeout(120)
async def test_a_reclaimed_turn_shows_both_attempts_the_lost_lease_and_the_decision(
    cluster: Cluster,  # noqa: F811
) -> None:
    """SIGKILL during an approved transfer: the second worker's reclaim does not erase the
    first attempt. The resumed turn's timeline (CLI and SQL view alike) shows attempt 1
    claimed by the first worker and its transfer started and never finished, the lost lease,
    attempt 2 claimed by the second worker and its transfer started and done; the paused
    turn's timeline shows the pause and bob's approval, each at its own time."""
    cluster.configure(transfer_seconds=2.5)
    first = cluster.start_worker()
    agent = cluster.app().banking_agent
    chat, _ = await paused_transfer(cluster, "Transfer $15 to Dan")
    paused_id = str(chat.snapshot_id)
    [pending] = await cluster.app().store.list_approvals(ApprovalQuery())
    decided = await decide(agent, pending, Decision(respond={"approved": True}), decided_by="bob")
    assert decided.resume_snapshot_id is not None
    turn_id = decided.resume_snapshot_id
    first_owner = await cluster.wait_claimed(turn_id)
    await cluster.wait_execution(f"{turn_id}:", "start")
    first.kill()
    second = cluster.start_worker()
    done = await agent.wait(turn_id, timeout=30)
    assert done.text == "Done. Transaction txn-15-dan.", cluster.logs()

    entries = timeline_of(cluster, turn_id)

    owners = [e["actor"] for e in entries if e["kind"] == "claimed"]
    assert len(owners) == 2 and owners[0] == first_owner and owners[1] != first_owner
    # A worker's id is host:pid:tag.
    assert [owner.split(":")[1] for owner in owners] == [str(first.pid), str(second.pid)]
    shown = [e for e in story(entries) if e[0] != "tool done" or "transferMoney" in e[3]]
    assert shown == [
        ("status", 0, None, "new -> pending"),
        ("claimed", 1, owners[0], f"claimed by {owners[0]} (attempt 1)"),
        ("tool started", 1, owners[0], "transferMoney transfer-1"),
        ("lease lost", 1, owners[0], f"lease of {owners[0]} expired (attempt 1)"),
        ("claimed", 2, owners[1], f"claimed by {owners[1]} (attempt 2)"),
        ("tool started", 2, owners[1], "transferMoney transfer-1"),
        ("tool done", 2, owners[1], "transferMoney transfer-1"),
        ("status", 2, owners[1], "pending -> completed"),
    ]
    times = [datetime.fromisoformat(e["at"]) for e in entries]
    assert times == sorted(times)

    view = await cluster.query(
        "SELECT kind, attempt, actor, detail FROM turn_timeline WHERE turn_id = %s "
        "ORDER BY at, seq",
        (turn_id,),
    )
    assert [tuple(r) for r in view] == story(entries)

    # The inspector runs Playwright's sync API, which wants a thread without an event loop.
    rows = await asyncio.to_thread(inspector_rows, cluster, turn_id)
    assert rows == [(k, "" if a is None else str(a), o or "", d) for k, a, o, d in story(entries)]

    shown_turn = run(cluster.url, "turns", "show", turn_id, "--json")
    assert shown_turn.status == 0, shown_turn.err
    assert story(shown_turn.json()["timeline"]) == story(entries)  # type: ignore[index]

    paused = story(timeline_of(cluster, paused_id))
    assert ("paused", 1, paused[1][2], "userApproval approval-1") in paused
    assert paused[-1] == ("decided", 1, "bob", "userApproval approval-1 approved by bob")
    paused_at = {e["kind"]: e["at"] for e in timeline_of(cluster, paused_id)}
    assert paused_at["paused"] < paused_at["decided"]
