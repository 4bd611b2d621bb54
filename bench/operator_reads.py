"""The operators' reads, retention and WAL per workflow at growing history (issue 34).

``python bench/operator_reads.py [--sizes 10000,100000,1000000] [--repeat 20]``

For each size, creates and migrates its own database and fills it with that many turns of
genuine workflows copied (``bench/grow_history.py``: ``--seed`` banking workflows run through
the product, ``--open-fraction`` of them left paused at the approval, then copied with every
id rewritten and the history spread over 30 days; with ``--open-approvals N`` only enough
copies keep the paused workflows for N open approvals at every size, so that the history
grows and the approvals waiting for a human do not), marks one settled turn in a hundred
``failed`` (the only rows not written by the product: the banking workflow never fails),
``VACUUM ANALYZE``s it, then times the product's own reads through ``SqlSessionStore`` and
``MonitoringDatabase``:

* ``turns ls`` — the first page (50), ``--status failed``, ``--status paused``,
  ``--agent --since`` (the last hour of the history);
* ``turns ls --session`` — a session's turns, the session named by its first characters
  (resolved as the command resolves it);
* ``turns show`` — one turn's detail; ``approvals ls`` — the inbox's first page;
* ``stats`` — every count of ``turnstile stats`` (on PostgreSQL the settled statuses from
  the table's statistics), and ``stats --exact`` (every status counted, all of ``turns`` read);
* ``GET /metrics`` — the scrape's database gauges.

It prints the p50 in ms per read and size: a read that costs its page stays flat as the
history grows (``stats --exact`` reads every turn, by design).

With ``--wal-workflows N`` it then runs batches of N more genuine workflows on that history
and prints, per workflow, the WAL of this database (``pg_walinspect``: the records changing
its pages and their transactions' commits, read through a temporary replication slot), how
much of it is full-page images and of which relations, and the commits: a batch right after
a ``CHECKPOINT`` and the next one, with the product's ids (``engine.ids``); then the same two
with each what-if of ``--wal-ids``: every id the product makes replaced by a random UUID4 (the
ids before ``engine.ids``) or a time-ordered version 7 UUID, to show what the ids' shape costs.

Then retention, which deletes what it measures, so it comes last: every session is idle (the
copies are days old, the seed is settled before the cutoff), and ``--retention-batches``
batches of the scheduler's size run through ``SqlSessionStore.prune_sessions``; it prints the
rows deleted per second (sessions, turns, messages, journal rows, events) and the p50 ms of a
batch. A batch that costs its sessions deletes as fast at 1M turns as at 10k. The databases
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
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench.common import (
    Databases,
    admin,
    checkpoint,
    dsn_for,
    fmt,
    machine,
    percentile,
    raise_on_sigterm,
    read_stats,
    render_table,
    url_for,
    wait_until_idle,
)
from bench.grow_history import build, run_workflows

#: One settled turn in a hundred failed (the banking workflow never fails).
FAIL_SOME = """
UPDATE turns SET status = 'failed', finish_reason = NULL,
                 error = '{"status": "INTERNAL", "message": "tool failed"}'
WHERE status = 'completed' AND finish_reason = 'stop' AND abs(hashtext(id)) % 100 = 0"""

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


async def _session_turns(store: Any, session_prefix: str) -> Any:
    """``turns ls --session <session_prefix>``: the prefix resolved to the session's id as
    the command resolves it, then the session's turns."""
    from stores.operations import TurnQuery

    found = await store.ids_starting("session", session_prefix, limit=2)
    return await store.list_turns(TurnQuery(session_id=found[0]))


async def time_reads(
    url: str, newest: datetime, turn_id: str, repeat: int
) -> dict[str, list[float]]:
    """The p50-able timings of each read on the database at ``url``; ``turn_id`` is the
    turn ``turns show`` reads."""
    from engine.store import ApprovalQuery
    from stores import SqlSessionStore
    from stores.monitoring import MonitoringDatabase
    from stores.operations import PAUSED, TurnQuery

    store = SqlSessionStore(url)
    monitoring = MonitoringDatabase(url)
    detail = await store.turn_detail(turn_id)
    assert detail is not None
    session_prefix = detail.turn.session_id[:8]
    reads: dict[str, Callable[[], Awaitable[Any]]] = {
        "turns ls (first page)": lambda: store.list_turns(TurnQuery()),
        "turns ls --status failed": lambda: store.list_turns(TurnQuery(statuses=("failed",))),
        "turns ls --status paused": lambda: store.list_turns(TurnQuery(statuses=(PAUSED,))),
        "turns ls --agent --since (last hour)": lambda: store.list_turns(
            TurnQuery(agent="bankingAgent", since=newest - timedelta(hours=1))
        ),
        "turns ls --session <prefix>": lambda: _session_turns(store, session_prefix),
        "turns show": lambda: store.turn_detail(turn_id),
        "approvals ls (first page)": lambda: store.list_approvals(ApprovalQuery()),
        "stats": store.read_stats,
        "stats --exact": lambda: store.read_stats(exact=True),
        "GET /metrics (database gauges)": lambda: asyncio.to_thread(
            monitoring.read_gauges, datetime.now(UTC)
        ),
    }
    try:
        return {label: await _timed(read, repeat) for label, read in reads.items()}
    finally:
        monitoring.dispose()
        await store.close()


#: This database's WAL between two positions (pg_walinspect): the records that change its
#: pages, and the records of the same transactions that change none (their commits); the WAL
#: of the other databases on the server (other work, other benchmarks) is left out.
OWN_WAL = """
WITH records AS (
    SELECT xid, record_length, fpi_length,
           block_ref LIKE '%%rel ' || %(tablespace)s || '/' || %(database)s || '/%%' AS own
    FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)),
writers AS (SELECT DISTINCT xid FROM records WHERE own AND xid <> '0')
SELECT coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0),
       count(*) FILTER (WHERE fpi_length > 0)
FROM records
WHERE own OR (xid IN (SELECT xid FROM writers) AND NOT coalesce(own, false))"""


#: This database's full-page images between two positions, by the relation imaged (the first
#: block of a record that carries one), most bytes first.
IMAGES_BY_RELATION = """
SELECT coalesce(pg_filenode_relation(0, node::oid)::text, node) AS relation,
       count(*) AS images, sum(fpi_length) AS bytes
FROM (SELECT substring(block_ref FROM %(imaged_block)s) AS node, fpi_length
      FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
      WHERE fpi_length > 0) imaged
WHERE node IS NOT NULL
GROUP BY 1 ORDER BY bytes DESC LIMIT 6"""


@dataclass(frozen=True)
class WalCost:
    """Per workflow: this database's WAL bytes, of which full-page images, their count, and
    commits (read-only transactions included)."""

    wal_bytes: float
    fpi_bytes: float
    fpi: float
    commits: float
    #: Full-page images per workflow of the relations imaged most.
    images_by_relation: dict[str, float]


def time_ordered_uuid() -> uuid.UUID:
    """A version 7 UUID (RFC 9562): the Unix time in milliseconds, then random bits, so the
    ids made one after another sort together."""
    value = (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80)
    value = value & ~(0xF << 76) | 0x7 << 76  # the version
    value = value & ~(0x3 << 62) | 0x2 << 62  # the variant
    return uuid.UUID(int=value)


#: The ids the workflows of a WAL batch get: the product's (``engine.ids.new_id``), or, as a
#: what-if that shows what the choice of ids costs, random UUID4s or version 7 UUIDs.
ID_KINDS: dict[str, Callable[..., str] | None] = {
    "product": None,
    "uuid4": lambda now=None: str(uuid.uuid4()),
    "time-ordered": lambda now=None: str(time_ordered_uuid()),
}


@contextmanager
def _ids_made_by(kind: str) -> Iterator[None]:
    """Measurement only: unless ``kind`` is ``product``, every module that makes ids with
    ``engine.ids.new_id`` makes them as ``ID_KINDS[kind]`` does instead."""
    from engine import ids

    maker = ID_KINDS[kind]
    patched = (
        [m for m in list(sys.modules.values()) if getattr(m, "new_id", None) is ids.new_id]
        if maker is not None
        else []
    )
    for module in patched:
        module.new_id = maker  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in patched:
            module.new_id = ids.new_id  # type: ignore[attr-defined]


def wal_per_workflow(name: str, workflows: int, *, offset: int) -> WalCost:
    """What ``workflows`` genuine workflows run on the database ``name`` cost in WAL."""
    dsn = dsn_for(name)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    with admin() as keeper:
        # Other databases' checkpoints would recycle the segments before they are read: a
        # temporary slot (dropped with this connection) keeps them.
        keeper.execute(
            "SELECT pg_create_physical_replication_slot(%s, true, true)",
            (f"turnstile_bench_wal_{os.getpid()}",),
        )
        row = keeper.execute(
            """SELECT oid, (SELECT oid FROM pg_tablespace WHERE spcname = 'pg_default')
               FROM pg_database WHERE datname = %s""",
            (name,),
        ).fetchone()
        assert row is not None
        database, tablespace = row
        wait_until_idle(name)
        start = keeper.execute("SELECT pg_current_wal_lsn()").fetchone()
        before = read_stats(name)
        asyncio.run(run_workflows(url_for(name), workflows, offset=offset))
        wait_until_idle(name)
        after = read_stats(name)
        end = keeper.execute("SELECT pg_current_wal_flush_lsn()").fetchone()
        assert start is not None and end is not None
        params = {"start": start[0], "end": end[0], "database": database, "tablespace": tablespace}
        params["imaged_block"] = rf"rel \d+/{database}/(\d+) fork \w+ blk \d+ \(FPW"
        with psycopg.connect(dsn, autocommit=True) as connection:
            own = connection.execute(OWN_WAL, params).fetchone()
            imaged = connection.execute(IMAGES_BY_RELATION, params).fetchall()
    assert own is not None
    commits = (after - before).commits
    per_workflow = [float(value) / workflows for value in (*own, commits)]
    by_relation = {str(relation): round(images / workflows, 2) for relation, images, _ in imaged}
    return WalCost(*per_workflow, images_by_relation=by_relation)


def main(argv: list[str] | None = None) -> int:
    """Populate each size, time the reads, print one table; always drop the databases."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="turns per database, commas")
    parser.add_argument("--seed", type=int, default=300, help="genuine workflows copied")
    parser.add_argument("--open-fraction", type=float, default=0.01, help="workflows paused")
    parser.add_argument(
        "--open-approvals",
        type=int,
        help="open approvals at every size (default: the paused share of every copy)",
    )
    parser.add_argument(
        "--wal-workflows", type=int, default=0, help="workflows run to measure WAL (0: none)"
    )
    parser.add_argument(
        "--wal-ids",
        default="product,uuid4",
        help="the ids of the WAL batches, in turn: product (engine.ids), and as what-ifs "
        "uuid4 (random) or time-ordered (UUID version 7)",
    )
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
    wal: dict[tuple[int, str], WalCost] = {}
    try:
        print("machine:", ", ".join(f"{k} {v}" for k, v in machine().items()), flush=True)
        for size in sizes:
            name = databases.create(f"reads{size}")
            growth = build(
                url_for(name),
                size,
                seed=args.seed,
                open_fraction=args.open_fraction,
                open_approvals=args.open_approvals,
            )
            with psycopg.connect(dsn_for(name), autocommit=True) as connection:
                connection.execute(FAIL_SOME)
                connection.execute("VACUUM ANALYZE turns")
                row = connection.execute(
                    "SELECT max(created_at), (SELECT id FROM turns ORDER BY random() LIMIT 1)"
                    " FROM turns"
                ).fetchone()
            assert row is not None
            print(f"{size:,} turns: {growth}", flush=True)
            results[size] = asyncio.run(time_reads(url_for(name), row[0], row[1], args.repeat))
            if args.wal_workflows:
                # Right after a CHECKPOINT every page's first change is written whole; the
                # next batch shows what is left once the pages it touches again are imaged.
                # Then the same with other ids, as what-ifs (--wal-ids).
                batches = ("after CHECKPOINT", "next batch")
                for ids in args.wal_ids.split(","):
                    checkpoint()
                    for number, batch in enumerate(batches):
                        offset = 10_000_000 + (len(wal) + number) * args.wal_workflows
                        with _ids_made_by(ids):
                            cost = wal_per_workflow(name, args.wal_workflows, offset=offset)
                        wal[size, f"{batch}, {ids}"] = cost
                        print(f"  WAL per workflow, {batch}, {ids} ids: {cost}", flush=True)
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
    if wal:
        print()
        print(f"{args.wal_workflows} genuine workflows on each history")
        wal_rows = [
            [
                f"{size:,} turns",
                batch,
                f"{cost.wal_bytes:,.0f}",
                f"{cost.wal_bytes - cost.fpi_bytes:,.0f}",
                fmt(cost.fpi, 1),
                fmt(cost.commits, 1),
            ]
            for (size, batch), cost in wal.items()
        ]
        headers = ["history", "batch", "WAL B/wf", "without images", "images/wf", "commits/wf"]
        print(render_table(headers, wal_rows))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("interrupted; databases dropped", file=sys.stderr)
        raise SystemExit(130) from None
