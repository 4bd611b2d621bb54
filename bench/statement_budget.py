"""Where the database's work per approval workflow goes: the statement budget.

``python bench/statement_budget.py [--slots 1,8] [--workflows 500] [--embedded]``

Starts a **private** PostgreSQL 15 instance (``initdb`` into a temporary folder, its own port
and socket folder, ``pg_stat_statements`` preloaded with ``track = all``, ``track_io_timing``
on, ``fsync`` on as in production), so the shared server and its counters are never touched. For
each slot count it copies a migrated template, starts one ``turnstile worker`` process with that
many slots (with ``--embedded``: instead a worker pool of that many slots in this process, on
the clients' store, as ``bench/approvals.py --impl turnstile-embedded`` runs it), runs
``--workflows`` approval workflows from ``--clients`` concurrent chats in this process
(``bench/approvals.py``'s Turnstile path, no warm-up, no idle phase) and prints, per normalized
statement (the statements inside trigger functions included, marked ``nested``): calls, rows,
mean and total execution ms, share of the top-level total, WAL bytes and shared blocks hit /
dirtied, all per workflow. Then the totals per workflow: commits
(``pg_stat_database.xact_commit``), writing transactions, WAL bytes (``pg_current_wal_lsn``) and
the server's CPU (every process of the private instance, from /proc), the rows each table got,
and the run's WAL by relation (``pg_walinspect``: each record counted for the table or index
its first block belongs to). The instance is stopped and deleted at the end, also on Ctrl-C
or SIGTERM.

A nested statement's time and WAL are also inside its top-level statement's figures, so the
shares are of the top-level total and the nested rows say where part of a top-level cost
went. ``docs/performance.md`` ("The statement budget") reads the result.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from bench import common

__all__ = [
    "EXPLAIN_SETTINGS",
    "Budget",
    "Line",
    "PrivateServer",
    "RelationWal",
    "StatementStats",
    "TableWrites",
    "Totals",
    "budget",
    "main",
    "private_server",
    "read_statements",
    "read_table_writes",
    "read_wal_by_relation",
    "render",
    "short_name",
]

PG_BIN = Path("/usr/lib/postgresql/15/bin")

#: Settings of the private instance: the statistics the budget reads, durability as in
#: production, and no statement log (it would cost the server CPU being measured).
SERVER_SETTINGS = {
    "shared_preload_libraries": "'pg_stat_statements'",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_utility": "on",
    "pg_stat_statements.track_planning": "on",
    "pg_stat_statements.max": "10000",
    "track_io_timing": "on",
    "fsync": "on",
    "synchronous_commit": "on",
    "shared_buffers": "128MB",
    "max_connections": "100",
    "listen_addresses": "'127.0.0.1'",
}

#: With ``--explain``: auto_explain logs ``EXPLAIN (ANALYZE, BUFFERS)`` of a sample of the
#: statements, nested ones included (its timing makes the run's figures slower).
EXPLAIN_SETTINGS = {
    "session_preload_libraries": "'auto_explain'",
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_buffers": "on",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_triggers": "on",
    "auto_explain.sample_rate": "0.02",
}

STATEMENTS_QUERY = """
SELECT queryid::text, toplevel, query, calls, rows, total_exec_time, plans, total_plan_time,
       wal_bytes::bigint, shared_blks_hit, shared_blks_dirtied
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)
"""


@dataclass(frozen=True)
class StatementStats:
    """One row of ``pg_stat_statements`` for the measured database (raw, whole run)."""

    queryid: str
    toplevel: bool
    query: str
    calls: int
    rows: int
    total_exec_ms: float
    plans: int
    total_plan_ms: float
    wal_bytes: int
    blocks_hit: int
    blocks_dirtied: int


@dataclass(frozen=True)
class Totals:
    """Whole-run counters of the measured database and the private instance."""

    workflows: int
    seconds: float
    commits: int
    write_xacts: int
    wal_bytes: int
    wal_records: int
    wal_fpi: int
    server_cpu_s: float | None
    errors: int


@dataclass(frozen=True)
class Line:
    """One normalized statement's cost per workflow."""

    name: str
    query: str
    nested: bool
    calls: float
    rows: float
    mean_ms: float
    ms: float
    plans: float
    plan_ms: float  # planning, outside the execution time (a prepared statement plans rarely)
    share: float  # of the top-level statements' total execution time
    wal_bytes: float
    blocks_hit: float
    blocks_dirtied: float


@dataclass(frozen=True)
class TableWrites:
    """Row versions one table got during the run (``pg_stat_user_tables``), whole run."""

    table: str
    inserted: int
    updated: int
    hot_updated: int  # updates that wrote no index entry
    deleted: int


@dataclass(frozen=True)
class RelationWal:
    """The WAL the run wrote for one relation (a table or an index; records that touch no
    relation, such as commits, under their resource manager's name), whole run."""

    relation: str
    records: int
    bytes: int  # the records' total length, full-page images included
    fpi_bytes: int


@dataclass(frozen=True)
class Budget:
    """The ranked statements of one run, per workflow, and the run's totals."""

    label: str
    lines: list[Line]
    totals: Totals
    tables: list[TableWrites] = field(default_factory=list)
    wal: list[RelationWal] = field(default_factory=list)

    @property
    def top_level_ms(self) -> float:
        """Execution ms per workflow of the statements the clients sent."""
        return sum(line.ms for line in self.lines if not line.nested)

    @property
    def round_trips(self) -> float:
        """Statements per workflow the clients sent (each one a round trip)."""
        return sum(line.calls for line in self.lines if not line.nested)


def short_name(query: str, width: int = 72) -> str:
    """The statement on one line, whitespace collapsed, cut to ``width`` characters."""
    flat = re.sub(r"\s+", " ", query).strip()
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def budget(
    label: str,
    stats: Sequence[StatementStats],
    totals: Totals,
    tables: Sequence[TableWrites] = (),
    wal: Sequence[RelationWal] = (),
) -> Budget:
    """Merge the rows of each normalized statement (same text and level: the same statement
    can get several query ids, e.g. from two search paths), divide by the workflows, rank
    by total execution time."""
    merged: dict[tuple[str, bool], list[StatementStats]] = {}
    for row in stats:
        merged.setdefault((short_name(row.query, 10_000), row.toplevel), []).append(row)
    per = max(totals.workflows, 1)
    top_total = sum(row.total_exec_ms for row in stats if row.toplevel) or 1.0
    lines = []
    for (text, toplevel), rows in merged.items():
        calls = sum(r.calls for r in rows)
        total_ms = sum(r.total_exec_ms for r in rows)
        lines.append(
            Line(
                name=short_name(text),
                query=text,
                nested=not toplevel,
                calls=calls / per,
                rows=sum(r.rows for r in rows) / per,
                mean_ms=total_ms / calls if calls else 0.0,
                ms=total_ms / per,
                plans=sum(r.plans for r in rows) / per,
                plan_ms=sum(r.total_plan_ms for r in rows) / per,
                share=total_ms / top_total,
                wal_bytes=sum(r.wal_bytes for r in rows) / per,
                blocks_hit=sum(r.blocks_hit for r in rows) / per,
                blocks_dirtied=sum(r.blocks_dirtied for r in rows) / per,
            )
        )
    lines.sort(key=lambda line: (-line.ms, line.name))
    written = [t for t in tables if t.inserted or t.updated or t.deleted]
    written.sort(key=lambda t: (-(t.inserted + t.updated + t.deleted), t.table))
    return Budget(label, lines, totals, written, sorted(wal, key=lambda r: (-r.bytes, r.relation)))


def render(result: Budget, *, limit: int | None = None, min_calls: float = 0.0) -> str:
    """The budget as a plain-text table and a totals line (``limit`` rows at most; rows
    with fewer than ``min_calls`` calls per workflow left out, e.g. start-up statements)."""
    shown = [line for line in result.lines if line.calls >= min_calls][:limit]
    rows = [
        [
            f"{rank}",
            "nested" if line.nested else "top",
            common.fmt(line.calls, 2),
            common.fmt(line.rows, 2),
            common.fmt(line.mean_ms, 3),
            common.fmt(line.ms, 3),
            common.fmt(line.plans, 2),
            common.fmt(line.plan_ms, 3),
            f"{line.share:.1%}",
            common.fmt(line.wal_bytes, 0),
            common.fmt(line.blocks_hit, 1),
            common.fmt(line.blocks_dirtied, 2),
            line.name,
        ]
        for rank, line in enumerate(shown, 1)
    ]
    headers = ["#", "level", "calls", "rows", "mean ms", "ms", "plans", "plan ms", "share", "WAL B"]
    headers += ["hit", "dirtied", "statement (per workflow)"]
    t = result.totals
    per = max(t.workflows, 1)
    cpu = "-" if t.server_cpu_s is None else f"{t.server_cpu_s * 1000 / per:.2f}"
    summary = (
        f"{result.label}: {t.workflows} workflows in {t.seconds:.1f} s "
        f"({t.workflows / t.seconds if t.seconds else 0:.1f}/s, {t.errors} errors); per "
        f"workflow: {result.round_trips:.1f} statements sent, top-level exec "
        f"{result.top_level_ms:.2f} ms, commits {t.commits / per:.2f}, write xacts "
        f"{t.write_xacts / per:.2f}, WAL {t.wal_bytes / per:,.0f} B ({t.wal_records / per:.0f} "
        f"records, {t.wal_fpi / per:.2f} full pages), server CPU {cpu} ms"
    )
    parts = [summary, common.render_table(headers, rows)]
    if result.tables:
        table_rows = [
            [
                t.table,
                common.fmt(t.inserted / per, 2),
                common.fmt(t.updated / per, 2),
                common.fmt(t.hot_updated / per, 2),
                common.fmt(t.deleted / per, 2),
            ]
            for t in result.tables
        ]
        headers = ["rows per workflow", "inserted", "updated", "of them HOT", "deleted"]
        parts += ["", common.render_table(headers, table_rows)]
    if result.wal:
        wal_rows = [
            [
                r.relation,
                common.fmt(r.records / per, 2),
                common.fmt(r.bytes / per, 0),
                common.fmt(r.fpi_bytes / per, 0),
                f"{r.bytes / max(t.wal_bytes, 1):.1%}",
            ]
            for r in result.wal
            if r.bytes / per >= 1
        ]
        headers = ["WAL per workflow", "records", "bytes", "of them full pages", "share"]
        parts += ["", common.render_table(headers, wal_rows)]
    return "\n".join(parts)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateServer:
    """A throwaway PostgreSQL 15 cluster in a temporary folder, owned by the ``postgres``
    OS user when this runs as root (``initdb`` refuses root). :meth:`stop` deletes it."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="turnstile-budget-"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self.settings = dict(SERVER_SETTINGS, **(settings or {}))
        self.port = _free_port()
        self.started = False

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *argv], check=True, capture_output=True, cwd=self.folder)

    def start(self) -> None:
        """initdb, configure and start the instance; wait until it accepts connections."""
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust")
        settings = dict(self.settings, port=str(self.port))
        settings["unix_socket_directories"] = f"'{self.folder}'"
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self.started = True
        log = str(self.log)
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", log, "-w", "start")
        with psycopg.connect(self.dsn, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    @property
    def dsn(self) -> str:
        """The admin database's libpq URL."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def cpu_seconds(self) -> float:
        """User + system CPU of the postmaster, its live children and its exited ones."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        total = common.process_cpu_seconds(Path(f"/proc/{postmaster}"), reaped=True)
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    if parent == postmaster:
                        total += common.process_cpu_seconds(entry)
        return total

    def stop(self) -> None:
        """Stop the instance (fast shutdown) and delete its folder."""
        try:
            if self.started:
                self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def private_server(settings: dict[str, str] | None = None) -> Iterator[PrivateServer]:
    """A started :class:`PrivateServer` (with ``settings`` added to its configuration) that
    the benchmark's helpers (``bench.common``) use as their admin server; stopped and
    deleted on exit."""
    server = PrivateServer(settings)
    previous = common.ADMIN_URL
    try:
        server.start()
        common.ADMIN_URL = server.dsn
        yield server
    finally:
        common.ADMIN_URL = previous
        server.stop()


def _lsn(connection: psycopg.Connection[Any]) -> int:
    row = connection.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def _lsn_text(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


#: Each WAL record of a range attributed to the relation of its first block reference
#: (named in the measured database; another database's or a shared catalog's by number), or
#: to its resource manager when it references no block.
WAL_BY_RELATION_QUERY = r"""
WITH records AS (
    SELECT resource_manager, record_length, fpi_length,
           regexp_match(block_ref, 'rel (\d+)/(\d+)/(\d+)') AS rel
    FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)
)
SELECT CASE
         WHEN rel IS NULL THEN '(' || resource_manager || ')'
         WHEN rel[2]::oid = (SELECT oid FROM pg_database WHERE datname = current_database())
           THEN coalesce(pg_filenode_relation(
                  CASE WHEN rel[1]::oid = (SELECT oid FROM pg_tablespace
                                           WHERE spcname = 'pg_default') THEN 0
                       ELSE rel[1]::oid END,
                  rel[3]::oid)::regclass::text, 'filenode ' || rel[3])
         ELSE 'database ' || rel[2] || ' filenode ' || rel[3]
       END AS relation,
       count(*), sum(record_length)::bigint, sum(fpi_length)::bigint
FROM records GROUP BY 1
"""


def read_wal_by_relation(database: str, start: int, end: int) -> list[RelationWal]:
    """The WAL between the positions ``start`` and ``end`` by relation (``pg_walinspect``,
    created in ``database`` for the purpose; the relations are named as it knows them)."""
    with psycopg.connect(common.dsn_for(database), autocommit=True) as connection:
        connection.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        rows = connection.execute(
            WAL_BY_RELATION_QUERY, (_lsn_text(start), _lsn_text(end))
        ).fetchall()
    return [RelationWal(str(row[0]), int(row[1]), int(row[2]), int(row[3])) for row in rows]


def read_statements(connection: psycopg.Connection[Any], database: str) -> list[StatementStats]:
    """Every ``pg_stat_statements`` row of ``database`` (top-level and nested)."""
    rows = connection.execute(STATEMENTS_QUERY, (database,)).fetchall()
    return [
        StatementStats(
            queryid=str(row[0]),
            toplevel=bool(row[1]),
            query=str(row[2]),
            calls=int(row[3]),
            rows=int(row[4]),
            total_exec_ms=float(row[5]),
            plans=int(row[6]),
            total_plan_ms=float(row[7]),
            wal_bytes=int(row[8]),
            blocks_hit=int(row[9]),
            blocks_dirtied=int(row[10]),
        )
        for row in rows
    ]


TABLES_QUERY = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
FROM pg_stat_user_tables ORDER BY relname
"""


def read_table_writes(database: str) -> list[TableWrites]:
    """Rows each table of ``database`` got since it was created (read once every backend
    that wrote has exited, so their counters are flushed)."""
    with psycopg.connect(common.dsn_for(database), autocommit=True) as connection:
        rows = connection.execute(TABLES_QUERY).fetchall()
    return [TableWrites(str(row[0]), *(int(value) for value in row[1:])) for row in rows]


def measure(
    server: PrivateServer, databases: common.Databases, template: str, args: argparse.Namespace
) -> Budget:
    """One run: a fresh copy of the template, one worker process of ``args.slots`` slots
    (``args.embedded``: a pool in this process instead), ``args.workflows`` workflows; the
    budget read before the copy is dropped."""
    from bench import approvals  # reads bench.common's admin URL when called

    name = databases.create(f"{args.slots}s", template=template)
    logs = Path(tempfile.mkdtemp(prefix="turnstile-budget-logs-"))
    children = common.Processes()
    try:
        common.checkpoint()
        with common.admin() as connection:
            connection.execute("SELECT pg_stat_statements_reset()")
            lsn_before = _lsn(connection)
        before, cpu_before = common.read_stats(name), server.cpu_seconds()
        phases = argparse.Namespace(
            workflows=args.workflows, warmup=0, idle=0, clients=args.clients, profile=None
        )
        embedded = args.slots if args.embedded else 0
        try:
            if not embedded:
                approvals.start_workers("turnstile", 1, args.slots, name, children, logs)
            clients = approvals.turnstile_clients(
                common.url_for(name),
                phases,
                children.check,
                embedded_slots=embedded,
                claim_log=logs / "claims-embedded.log",
            )
            _, _, errors, seconds = asyncio.run(clients)
        finally:
            children.stop()
        common.wait_until_idle(name)
        stats, cpu = common.read_stats(name) - before, server.cpu_seconds() - cpu_before
        with common.admin() as connection:
            wal = _lsn(connection) - lsn_before
            statements = read_statements(connection, name)
        tables = read_table_writes(name)
        wal_by_relation = read_wal_by_relation(name, lsn_before, lsn_before + wal)
        totals = Totals(
            workflows=args.workflows,
            seconds=seconds,
            commits=stats.commits,
            write_xacts=stats.write_xacts,
            wal_bytes=wal,
            wal_records=stats.wal_records,
            wal_fpi=stats.wal_fpi,
            server_cpu_s=cpu,
            errors=len(errors),
        )
        where = "embedded pool" if args.embedded else "1 process"
        label = f"{where} x {args.slots} slots"
        return budget(label, statements, totals, tables, wal_by_relation)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
        databases.drop(name)


def main(argv: list[str] | None = None) -> int:
    """Parse the options, start the private instance, run each slot count, print budgets."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workflows", type=int, default=500, help="workflows per run")
    parser.add_argument("--slots", default="1,8", help="slots of the one worker, e.g. 1,8")
    parser.add_argument("--clients", type=int, default=32, help="concurrent client chats")
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="run the worker pool in this process, on the clients' store, instead of a "
        "turnstile worker process",
    )
    parser.add_argument("--limit", type=int, default=40, help="statements printed per run")
    parser.add_argument(
        "--min-calls",
        type=float,
        default=0.01,
        help="leave out statements called less often per workflow (start-up, polling)",
    )
    parser.add_argument("--full", action="store_true", help="also print each full statement")
    parser.add_argument("--json", type=Path, help="also write the raw budgets here")
    parser.add_argument(
        "--explain",
        type=Path,
        metavar="LOG_FILE",
        help="log EXPLAIN (ANALYZE, BUFFERS) of 2%% of the statements (auto_explain) and copy "
        "the server's log here; the run's times are then inflated",
    )
    common.add_what_if_option(parser)
    args = parser.parse_args(argv)
    common.raise_on_sigterm()
    results: list[Budget] = []
    with private_server(EXPLAIN_SETTINGS if args.explain else None) as server:
        databases = common.Databases("turnstile_budget")
        try:
            template = databases.create("template")
            from stores import migrate

            migrate(common.url_for(template))
            common.apply_what_ifs(template, args.what_if)
            for slots in [int(part) for part in args.slots.split(",") if part.strip()]:
                started = time.monotonic()
                run_args = argparse.Namespace(**{**vars(args), "slots": slots})
                result = measure(server, databases, template, run_args)
                results.append(result)
                print(render(result, limit=args.limit, min_calls=args.min_calls))
                if args.full:
                    for rank, line in enumerate(result.lines[: args.limit], 1):
                        print(f"\n[{rank}] {line.query}")
                print(f"({time.monotonic() - started:.0f} s)\n", flush=True)
        finally:
            databases.close()
            if args.explain:
                shutil.copyfile(server.log, args.explain)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 1 if any(r.totals.errors for r in results) else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print(
            "interrupted; the private PostgreSQL instance is stopped and deleted", file=sys.stderr
        )
        raise SystemExit(130) from None
