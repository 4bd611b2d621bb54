"""``turnstile stats``: the database at a glance — turns by status, the queue, the oldest
pending turn and the open approvals by age (:func:`stores.operations.read_stats`). On
PostgreSQL the settled statuses are estimates, marked ``≈``, unless ``--exact``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import click
from rich.table import Table

from stores.operations import Stats
from workers.cli.operator import OperatorCommand, json_option, named_option, run_on_store
from workers.cli.output import ago, console, emit_json, iso, seconds_since, table
from workers.cli.params import db_option

__all__ = ["stats", "stats_wire"]


def stats_wire(read: Stats) -> dict[str, Any]:
    """``turnstile stats --json``."""
    oldest = read.oldest_pending
    approvals = read.approvals
    return {
        "at": iso(read.at),
        "turns": dict(read.turns),
        "estimated": list(read.estimated),
        "analyzed_at": iso(read.analyzed_at),
        "paused": read.paused,
        "queue": read.queue.model_dump(),
        "oldest_pending": {
            "turn_id": oldest.turn_id,
            "agent": oldest.agent,
            "created_at": iso(oldest.created_at),
            "run_after": iso(oldest.run_after),
            "age_seconds": seconds_since(oldest.created_at, read.at),
        }
        if oldest
        else None,
        "approvals": {
            "open": approvals.open,
            "decided_waiting": approvals.decided_waiting,
            "by_age": dict(approvals.by_age),
            "oldest_created_at": iso(approvals.oldest_created_at),
        },
        "versions": [v.model_dump() for v in read.versions],
    }


def _counts(title: str, columns: list[str], counts: Mapping[str, int]) -> Table:
    """A table of one count per label: a status, what turns wait for, an age."""
    return table(title, columns, ([label, count] for label, count in counts.items()))


#: What marks an estimated count in the table.
ABOUT = "≈"


def _turn_counts(read: Stats) -> dict[str, str]:
    """Each status's count, an estimate marked as one, then the paused turns."""
    counts = {
        status: f"{ABOUT} {count}" if status in read.estimated else str(count)
        for status, count in read.turns.items()
    }
    return {**counts, "(of the completed: paused at approvals now)": str(read.paused)}


def _estimate_note(read: Stats, now: datetime) -> str:
    """What the marked counts are, and how to count them exactly."""
    gathered = (
        f"gathered {ago(read.analyzed_at, now)} ago"
        if read.analyzed_at is not None
        else "when they were gathered is not known"
    )
    return (
        f"{ABOUT} estimated from PostgreSQL's statistics of turns ({gathered}); "
        "--exact counts them, reading every turn."
    )


def _print(read: Stats, now: datetime) -> None:
    out = console()
    out.print(table("Turns", ["STATUS", "TURNS"], _turn_counts(read).items()))
    if read.estimated:
        out.print(_estimate_note(read, now), markup=False)
    queue = read.queue
    oldest = read.oldest_pending
    out.print(
        _counts(
            "Queue",
            ["WAITING FOR", "TURNS"],
            {
                "a worker (claimable now)": queue.claimable,
                "their retry backoff": queue.backing_off,
                "nothing: running": queue.running,
                "their worker to stop (aborting)": queue.aborting,
            },
        )
    )
    if oldest is not None:
        out.print(
            f"Oldest pending turn: {oldest.turn_id} ({oldest.agent}), created "
            f"{ago(oldest.created_at, now)} ago",
            markup=False,
        )
    else:
        out.print("No pending turn.")
    if read.versions:
        out.print(
            table(
                "Waiting turns by version",
                ["AGENT", "VERSION", "CLAIMABLE", "PAUSED"],
                (
                    [v.agent, v.version or "(unpinned)", v.claimable, v.paused]
                    for v in read.versions
                ),
            )
        )
    approvals = read.approvals
    out.print(
        _counts(
            "Open approvals by age",
            ["AGE", "APPROVALS"],
            {**approvals.by_age, "(decided, resume not queued yet)": approvals.decided_waiting},
        )
    )


@click.command(
    "stats", cls=OperatorCommand, short_help="Turns by status, the queue, approvals by age."
)
@db_option
@json_option
@named_option(
    "--exact",
    "exact",
    is_flag=True,
    help="count the settled turns exactly (reads every turn), not from statistics",
)
def stats(db: str | None, as_json: bool, exact: bool) -> int:
    """Turns by status, the queue, the oldest pending turn, open approvals by age. On
    PostgreSQL the settled statuses (completed, failed, aborted) are estimates from the
    table's statistics, marked ≈; --exact counts them."""
    read = run_on_store(db, lambda store: store.read_stats(exact=exact))
    if as_json:
        emit_json(stats_wire(read))
    else:
        _print(read, read.at)
    return 0
