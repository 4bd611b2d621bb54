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
history grows (``stats``' count by status still reads every turn, by design). The databases
are dropped at the end, also when interrupted.
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
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    raise_on_sigterm()
    databases = Databases(f"turnstile_bench_{os.getpid()}")
    results: dict[int, dict[str, list[float]]] = {}
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
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("interrupted; databases dropped", file=sys.stderr)
        raise SystemExit(130) from None
