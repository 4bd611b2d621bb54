"""The operators' reads and the metrics' scrape at growing history (issue 34).

``python bench/operator_reads.py [--sizes 10000,100000] [--repeat 20]``

For each size, creates and migrates its own database and fills it with that many turns as
``bench/open_approvals.py`` does (sessions of two turns: paused at an approval, then resumed;
``--open-fraction`` of them still paused), marks one resumed turn in a hundred ``failed``,
``VACUUM ANALYZE``s it, then times the product's own reads through ``SqlSessionStore`` and
``MonitoringDatabase``:

* ``turns ls`` — the first page (50), ``--status failed``, ``--status paused``,
  ``--agent --since`` (the last hour of the history);
* ``stats`` — every count of ``turnstile stats``;
* ``GET /metrics`` — the scrape's database gauges.

It prints the p50 in ms per read and size: a read that costs its page stays flat as the
history grows (``stats``' count by status still reads every turn, by design).

Then retention, which deletes what it measures, so it comes last: each turn is given two
messages and two status events, every session is made idle, and ``--retention-batches``
batches of the scheduler's size run through ``SqlSessionStore.prune_sessions``; it prints
the rows deleted per second (sessions, turns, messages, journal rows, events) and the p50 ms
of a batch. A batch that costs its sessions deletes as fast at 100k turns as at 10k. The
databases are dropped at the end, also when interrupted.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench.common import (
    Databases,
    dsn_for,
    fmt,
    machine,
    percentile,
    raise_on_sigterm,
    render_table,
    url_for,
)
from bench.open_approvals import populate

#: One resumed turn in a hundred failed (the populated history has none).
FAIL_SOME = """
UPDATE turns SET status = 'failed', finish_reason = NULL,
                 error = '{"status": "INTERNAL", "message": "tool failed"}'
WHERE seq = 2 AND split_part(id, '-', 2)::int % 100 = 0"""


#: What a real turn holds besides its row and journal: two messages, two status events.
TURN_ROWS = [
    """INSERT INTO messages (turn_id, round, position, role, content, committed, created_at)
       SELECT id, 0, p, 'user', '[{"text": "transfer $40 to carol"}]', true, created_at
       FROM turns, generate_series(0, 1) p""",
    """INSERT INTO turn_events (turn_id, from_status, to_status, attempt, at)
       SELECT id, NULL::turn_status, 'pending'::turn_status, 0, created_at FROM turns
       UNION ALL SELECT id, 'pending'::turn_status, status, 1, updated_at FROM turns""",
]
#: The tables whose rows a retention batch deletes, counted before and after.
RETAINED = ("sessions", "turns", "messages", "tool_calls", "turn_events")


def _count_retained(dsn: str) -> int:
    with psycopg.connect(dsn) as connection:
        total = 0
        for table in RETAINED:
            row = connection.execute(f"SELECT count(*) FROM {table}").fetchone()
            assert row is not None
            total += row[0]
        return total


def add_turn_rows(dsn: str) -> None:
    """Give every turn its messages and events, and analyse the tables they went to."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        # Bulk load without the foreign-key triggers: the rows are consistent by construction.
        connection.execute("SET session_replication_role = replica")
        for statement in TURN_ROWS:
            connection.execute(statement)
        connection.execute("SET session_replication_role = origin")
        connection.execute("VACUUM ANALYZE messages, turn_events")


async def time_retention(url: str, dsn: str, batches: int) -> tuple[int, float, list[float]]:
    """Rows deleted, seconds taken and ms per batch of up to ``batches`` retention batches
    of the scheduler's size, with every session idle."""
    from stores import SqlSessionStore
    from workers.scheduler import RETENTION_BATCH

    before = _count_retained(dsn)
    store = SqlSessionStore(url)
    cutoff = datetime.now(UTC)
    times: list[float] = []
    try:
        for _ in range(batches):
            started = time.perf_counter()
            deleted = await store.prune_sessions(settled_before=cutoff, limit=RETENTION_BATCH)
            times.append((time.perf_counter() - started) * 1e3)
            if deleted < RETENTION_BATCH:
                break
    finally:
        await store.close()
    return before - _count_retained(dsn), sum(times) / 1e3, times


async def _timed(read: Callable[[], Awaitable[Any]], repeat: int, warmup: int = 3) -> list[float]:
    """Milliseconds per call of ``read``, after a warm-up."""
    times = []
    for number in range(warmup + repeat):
        started = time.perf_counter()
        await read()
        if number >= warmup:
            times.append((time.perf_counter() - started) * 1e3)
    return times


async def time_reads(url: str, newest: datetime, repeat: int) -> dict[str, list[float]]:
    """The p50-able timings of each read on the database at ``url``."""
    from stores import SqlSessionStore
    from stores.monitoring import MonitoringDatabase
    from stores.operations import PAUSED, TurnQuery

    store = SqlSessionStore(url)
    monitoring = MonitoringDatabase(url)
    reads: dict[str, Callable[[], Awaitable[Any]]] = {
        "turns ls (first page)": lambda: store.list_turns(TurnQuery()),
        "turns ls --status failed": lambda: store.list_turns(TurnQuery(statuses=("failed",))),
        "turns ls --status paused": lambda: store.list_turns(TurnQuery(statuses=(PAUSED,))),
        "turns ls --agent --since (last hour)": lambda: store.list_turns(
            TurnQuery(agent="bankingAgent", since=newest - timedelta(hours=1))
        ),
        "stats": store.read_stats,
        "GET /metrics (database gauges)": lambda: asyncio.to_thread(
            monitoring.read_gauges, datetime.now(UTC)
        ),
    }
    try:
        return {label: await _timed(read, repeat) for label, read in reads.items()}
    finally:
        monitoring.dispose()
        await store.close()


def main(argv: list[str] | None = None) -> int:
    """Populate each size, time the reads, print one table; always drop the databases."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="turns per database, commas")
    parser.add_argument("--open-fraction", type=float, default=0.01, help="turns paused")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per read")
    parser.add_argument(
        "--retention-batches", type=int, default=10, help="retention batches timed per size"
    )
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    raise_on_sigterm()
    databases = Databases(f"turnstile_bench_{os.getpid()}")
    results: dict[int, dict[str, list[float]]] = {}
    retention: dict[int, tuple[int, float, list[float]]] = {}
    try:
        print("machine:", ", ".join(f"{k} {v}" for k, v in machine().items()), flush=True)
        from stores import migrate

        for size in sizes:
            name = databases.create(f"reads{size}")
            migrate(url_for(name))
            info = populate(dsn_for(name), size, args.open_fraction)
            with psycopg.connect(dsn_for(name), autocommit=True) as connection:
                connection.execute(FAIL_SOME)
                connection.execute("VACUUM ANALYZE turns")
                row = connection.execute("SELECT max(created_at) FROM turns").fetchone()
            assert row is not None
            print(f"{size:,} turns:", ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
            results[size] = asyncio.run(time_reads(url_for(name), row[0], args.repeat))
            add_turn_rows(dsn_for(name))
            retention[size] = asyncio.run(
                time_retention(url_for(name), dsn_for(name), args.retention_batches)
            )
            databases.drop(name)
    finally:
        databases.close()
    labels = list(results[sizes[0]])
    rows = [
        [label, *(fmt(percentile(results[size][label], 50), 2) for size in sizes)]
        for label in labels
    ]
    print()
    print(f"p50 ms of {args.repeat} runs per read")
    print(render_table(["read", *(f"{size:,} turns" for size in sizes)], rows))
    print()
    print(f"retention: up to {args.retention_batches} batches per size, every session idle")
    retention_rows = [
        [
            f"{size:,} turns",
            f"{len(times)}",
            f"{deleted:,}",
            fmt(seconds, 2),
            f"{deleted / seconds:,.0f}" if seconds else "",
            fmt(percentile(times, 50), 1),
        ]
        for size, (deleted, seconds, times) in retention.items()
    ]
    headers = ["history", "batches", "rows deleted", "seconds", "rows/s", "p50 ms/batch"]
    print(render_table(headers, retention_rows))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("interrupted; databases dropped", file=sys.stderr)
        raise SystemExit(130) from None
