"""A PostgreSQL history of N turns, made of genuine workflows copied (issue 34).

``python bench/grow_history.py --turns 1000000 [--seed 300] [--open-fraction 0.01]
[--open-approvals N] [--keep]``

:func:`build` runs ``seed`` genuine workflows of the banking example through the product (a
``WorkerPool`` and the chats in this process, as ``bench/in_process.py`` does): send, pause at
the userApproval interrupt, (every other one) an approver claims it, approve, transfer, done —
except an ``open_fraction`` of them left paused at the approval. Then :func:`grow` multiplies
those rows with ``INSERT … SELECT``, a batch of copies per transaction, until the table
``turns`` holds about ``turns`` rows. By default every copy keeps the seed's paused
workflows, so the open approvals grow with the history; with ``open_approvals`` only the
first copies do (enough for that many), and the rest copy the settled workflows alone: a
history as large, whose approvals waiting for a human stay as few as a deployment whose
approvers keep up (or whose approvals expire) would have.

The copier is generic over the schema: it reads the tables and columns from
``stores.schema.metadata``, so a column or table another change adds is copied too, by these
rules:

* an *id column* is ``sessions.id`` or ``turns.id``, a column whose foreign key ends at one
  (``turns.parent_id``, ``messages.turn_id``, ``approval_votes.turn_id`` through
  ``tool_calls``), or one named ``session_id`` / ``turn_id`` (``approval_queue``'s copies); a
  table with none is not copied (``agent_definitions``, the UI's sign-ins). Copy ``k`` maps an
  id ``x`` to the UUID ``md5(x || '/' || k)`` — the same function everywhere, so the copies'
  references stay consistent and look like the product's own ids;
* a text or JSON value that embeds seed ids (an idempotency key: its own turn's id, or the
  asking turn's on a resumed turn's answer; a webhook's body) has each replaced by its copy's
  (the seed ids each value holds are listed once, on the seed);
* the text columns of a primary key without an id column (``webhook_deliveries.id``) are
  mapped like ids, so the copies do not collide;
* every timestamp moves back by ``(copies + 1 - k)`` steps of ``span / copies``: the copies
  spread the history over ``span`` (30 days by default), oldest first on disk, the seed the
  newest;
* identity columns are left to the database.

Triggers: the copies are loaded with ``session_replication_role = replica``, so neither the
foreign-key triggers nor the ``approval_queue`` triggers run (the rows are consistent by
construction, and a row-by-row trigger would cost the load more than the copy itself). The
queue is copied like any other table — it holds the seed's open approvals, so its copies are
the copies' — and then checked against migration 0003's backfill (the open interrupted calls
of paused turns that are their session's latest). ``VACUUM ANALYZE`` ends the build.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import math
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql

from bench.common import STATE_KEYS, Databases, dsn_for, machine, raise_on_sigterm, url_for
from bench.open_approvals import OPEN_CALLS

__all__ = [
    "CopyPlan",
    "Growth",
    "TableCopy",
    "build",
    "copy_plan",
    "grow",
    "queue_mismatches",
    "run_workflows",
]

#: The tables whose rows are what every id maps from.
ROOTS = {("sessions", "id"), ("turns", "id")}
#: Columns taken for ids by name, where the schema has no foreign key to say so.
ID_NAMES = {"session_id", "turn_id"}

# A batch's parameters: its copies' numbers, how many copies in all, the time between two.
FIRST, LAST = sql.SQL("%(first)s::int"), sql.SQL("%(last)s::int")
COPIES, STEP = sql.SQL("%(copies)s::int"), sql.SQL("%(step)s::interval")
#: The copies up to this one keep the seed's paused workflows; later ones leave them out.
OPEN_COPIES = sql.SQL("%(open_copies)s::int")

#: Migration 0003's backfill: the open approvals the triggers would have queued.
BACKFILL = f"SELECT c.turn_id, c.round, c.ref{OPEN_CALLS}"


def _is_open(k: int, open_fraction: float) -> bool:
    """Whether workflow ``k`` stays paused: one in ``1 / open_fraction``, evenly spread."""
    return math.floor((k + 1) * open_fraction) > math.floor(k * open_fraction)


async def run_workflows(
    url: str, count: int, *, open_fraction: float = 0.0, offset: int = 0, clients: int = 8
) -> int:
    """Run ``count`` banking workflows through the product on the database at ``url``,
    ``clients`` at a time; the ``open_fraction`` left paused at the approval. Returns how many
    were left open."""
    from engine.store import AssignmentChange
    from examples.banking import build as build_banking
    from stores import SqlSessionStore
    from workers import WorkerPool

    store = SqlSessionStore(url)
    app = build_banking(store=store, state_keys=STATE_KEYS)
    numbers = iter(range(offset, offset + count))
    left_open = 0

    async def client() -> None:
        nonlocal left_open
        for k in numbers:
            chat = app.banking_agent.chat()
            paused = await chat.send(f"Transfer ${k + 1} to acct {k}")
            if k % 2 == 0 and paused.snapshot_id is not None:
                # An approver claims every other approval first, as the inbox does.
                asked = await store.list_calls(paused.snapshot_id)
                call = next(c for c in asked if c.status == "interrupted")
                claim = AssignmentChange(action="claim", by=f"approver-{k % 5}")
                await store.change_assignment(
                    call.turn_id, call.round, call.ref, claim, default_group=None
                )
            if _is_open(k, open_fraction):
                left_open += 1
                continue
            approval = next(i for i in paused.interrupts if i.name == "userApproval")
            done = await chat.resume(respond=[approval.respond({"approved": True})])
            if done.text != f"Done. Transaction txn-{k + 1}-acct-{k}.":
                raise RuntimeError(f"unexpected answer {done.text!r}")

    try:
        async with WorkerPool(app.ai, store, concurrency=clients, scheduler=False):
            await asyncio.gather(*(client() for _ in range(clients)))
    finally:
        await store.close()
    return left_open


def _id_columns(metadata: sa.MetaData) -> set[sa.Column[Any]]:
    """Every column holding a session's or a turn's id (the module's first rule)."""
    found: set[sa.Column[Any]] = set()
    changed = True
    while changed:  # a foreign key may end at a column found in an earlier pass
        changed = False
        for table in metadata.sorted_tables:
            for column in table.columns:
                if column in found:
                    continue
                if (
                    (table.name, column.name) in ROOTS
                    or column.name in ID_NAMES
                    or any(key.column in found for key in column.foreign_keys)
                ):
                    found.add(column)
                    changed = True
    return found


def _is_text(column: sa.Column[Any]) -> bool:
    return isinstance(column.type, sa.String)


def _is_json(column: sa.Column[Any]) -> bool:
    return isinstance(column.type, sa.JSON) or "JSON" in type(column.type).__name__.upper()


@dataclass(frozen=True)
class TableCopy:
    """How one table's seed rows become a copy's: the columns and what each is made of."""

    table: str
    columns: list[str]
    ids: list[str]  # mapped to their copies' ids
    keys: list[str]  # text key columns mapped like ids (no id column in the key)
    timestamps: list[str]  # shifted back in time
    # Text or JSON columns whose values embed seed ids: the most ids one value holds (the
    # seed's ``ids_in_<column>`` lists them per row).
    embedding: dict[str, int] = field(default_factory=dict)
    json: list[str] = field(default_factory=list)  # of those, the JSON ones

    def select(self) -> sql.Composed:
        """The ``SELECT`` over ``seed_<table>`` cross ``generate_series(...) k``."""

        def mapped(value: sql.Composable) -> sql.Composable:
            return sql.SQL("md5({} || '/' || k)::uuid::text").format(value)

        parts: list[sql.Composable] = []
        for name in self.columns:
            column = sql.Identifier(name)
            if name in self.ids or name in self.keys:
                parts.append(mapped(column))
            elif name in self.timestamps:
                parts.append(sql.SQL("{} - ({} + 1 - k) * {}").format(column, COPIES, STEP))
            elif name in self.embedding:
                value: sql.Composable = sql.SQL("{}::text").format(column)
                for number in range(1, self.embedding[name] + 1):
                    # An empty search string leaves the value as it is (fewer ids than slots).
                    seed_id = sql.SQL("{}[{}]").format(
                        sql.Identifier(f"ids_in_{name}"), sql.Literal(number)
                    )
                    value = sql.SQL("replace({}, coalesce({}, ''), coalesce({}, ''))").format(
                        value, seed_id, mapped(seed_id)
                    )
                cast = "jsonb" if name in self.json else "text"
                parts.append(sql.SQL("({})::{}").format(value, sql.SQL(cast)))
            else:
                parts.append(column)
        # A row of a paused workflow is copied only into the copies that keep them.
        return sql.SQL(
            "SELECT {} FROM {} CROSS JOIN generate_series({}, {}) k "
            "WHERE k <= {} OR NOT of_paused_workflow ORDER BY k"
        ).format(
            sql.SQL(", ").join(parts),
            sql.Identifier(f"seed_{self.table}"),
            FIRST,
            LAST,
            OPEN_COPIES,
        )


@dataclass(frozen=True)
class CopyPlan:
    """The tables copied, in foreign-key order, the turns one copy adds and the open
    approvals it holds (when it keeps the paused workflows)."""

    tables: list[TableCopy]
    seed_turns: int
    seed_open_approvals: int


def copy_plan(connection: psycopg.Connection[Any], metadata: sa.MetaData | None = None) -> CopyPlan:
    """Snapshot the seed (the database's rows now) into temporary tables ``seed_<table>`` on
    ``connection`` and decide how each table is copied, from the schema
    (``stores.schema.metadata`` by default) and the seed (the module's rules)."""
    if metadata is None:
        from stores.schema import metadata as schema

        metadata = schema
    ids = _id_columns(metadata)
    roots = sql.SQL(" UNION ").join(
        sql.SQL("SELECT {} AS id FROM {}").format(sql.Identifier(c), sql.Identifier(t))
        for t, c in sorted(ROOTS)
    )
    connection.execute(sql.SQL("CREATE TEMP TABLE seed_ids AS {}").format(roots))
    # The paused workflows: the sessions with an open approval, and their turns (their
    # rows are copied into the first open_copies copies only, see grow).
    connection.execute(
        "CREATE TEMP TABLE seed_open_ids AS "
        "SELECT session_id AS id FROM approval_queue "
        "UNION SELECT id FROM turns WHERE session_id IN (SELECT session_id FROM approval_queue)"
    )
    tables: list[TableCopy] = []
    for table in metadata.sorted_tables:
        id_names = [c.name for c in table.columns if c in ids]
        if not id_names:
            continue
        seed = sql.Identifier(f"seed_{table.name}")
        connection.execute(
            sql.SQL("CREATE TEMP TABLE {} AS SELECT * FROM {}").format(
                seed, sql.Identifier(table.name)
            )
        )
        _mark_paused_workflows(connection, seed, id_names)
        columns = [c.name for c in table.columns if c.identity is None]
        key = list(table.primary_key.columns)
        keys = [] if any(c in ids for c in key) else [c.name for c in key if _is_text(c)]
        timestamps = [c.name for c in table.columns if isinstance(c.type, sa.DateTime)]
        candidates = [
            c
            for c in table.columns
            if c.name in columns
            and c.name not in id_names
            and c.name not in keys
            and (_is_text(c) or _is_json(c))
        ]
        embedding = {}
        for column in candidates:
            most = _list_embedded_ids(connection, seed, column.name)
            if most:
                embedding[column.name] = most
        json = [c.name for c in candidates if c.name in embedding and _is_json(c)]
        tables.append(TableCopy(table.name, columns, id_names, keys, timestamps, embedding, json))
    row = connection.execute(
        "SELECT (SELECT count(*) FROM seed_turns), (SELECT count(*) FROM seed_approval_queue)"
    ).fetchone()
    assert row is not None
    return CopyPlan(tables, int(row[0]), int(row[1]))


def _mark_paused_workflows(
    connection: psycopg.Connection[Any], seed: sql.Identifier, id_names: list[str]
) -> None:
    """Give ``seed`` a column ``of_paused_workflow``: whether the row belongs to a workflow
    the seed left paused (one of its id columns names a session or turn of seed_open_ids)."""
    connection.execute(sql.SQL("ALTER TABLE {} ADD COLUMN of_paused_workflow boolean").format(seed))
    connection.execute(
        sql.SQL(
            # COLLATE: an id column in another collation than seed_open_ids' would leave
            # the comparison without one.
            "UPDATE {} SET of_paused_workflow = EXISTS ("
            'SELECT 1 FROM seed_open_ids o WHERE o.id COLLATE "C" IN ({}))'
        ).format(
            seed,
            sql.SQL(", ").join(
                sql.SQL("{}.{}").format(seed, sql.Identifier(name)) for name in id_names
            ),
        )
    )


def _list_embedded_ids(
    connection: psycopg.Connection[Any], seed: sql.Identifier, column: str
) -> int:
    """Give ``seed`` a column ``ids_in_<column>``: the seed ids each row's ``column`` holds
    (its own, its parent's, any); returns the most one row holds (0: leave the column be)."""
    listed = sql.Identifier(f"ids_in_{column}")
    connection.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} text[]").format(seed, listed))
    connection.execute(
        sql.SQL(
            "UPDATE {} SET {} = ARRAY(SELECT id FROM seed_ids WHERE strpos({}::text, id) > 0)"
        ).format(seed, listed, sql.Identifier(column))
    )
    row = connection.execute(
        sql.SQL("SELECT coalesce(max(cardinality({})), 0) FROM {}").format(listed, seed)
    ).fetchone()
    return int(row[0]) if row else 0


@dataclass(frozen=True)
class Growth:
    """What :func:`grow` made: copies, turns in the end, seconds of copying and vacuuming."""

    copies: int
    turns: int
    open_approvals: int
    copy_seconds: float
    vacuum_seconds: float
    embedding: dict[str, list[str]]  # per table, the columns whose values embed ids


def queue_mismatches(connection: psycopg.Connection[Any]) -> int:
    """Rows in ``approval_queue`` or in migration 0003's backfill but not both."""
    row = connection.execute(
        f"""SELECT count(*) FROM (
                (SELECT turn_id, round, ref FROM approval_queue EXCEPT {BACKFILL})
                UNION ALL
                ({BACKFILL} EXCEPT SELECT turn_id, round, ref FROM approval_queue)) differ"""
    ).fetchone()
    assert row is not None
    return int(row[0])


def grow(
    dsn: str,
    turns: int,
    *,
    span: timedelta = timedelta(days=30),
    batch_turns: int = 100_000,
    vacuum: bool = True,
    progress: bool = False,
    open_approvals: int | None = None,
) -> Growth:
    """Copy the database's rows (the seed) until ``turns`` holds about ``turns`` rows; with
    ``open_approvals``, only as many copies keep the seed's paused workflows as hold that
    many open approvals with the seed's (rounded up to whole copies)."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as connection:
        plan = copy_plan(connection)
        if plan.seed_turns == 0:
            raise ValueError("the database holds no turns to copy")
        copies = max(0, math.ceil(turns / plan.seed_turns) - 1)
        per_batch = max(1, batch_turns // plan.seed_turns)
        step = span / max(copies, 1)
        open_copies = copies
        if open_approvals is not None:
            wanted = math.ceil(open_approvals / max(plan.seed_open_approvals, 1)) - 1
            open_copies = max(0, min(copies, wanted))
        connection.execute("SET maintenance_work_mem = '256MB'")
        # The copies are consistent by construction: no foreign-key or queue trigger runs.
        connection.execute("SET session_replication_role = replica")
        for first in range(1, copies + 1, per_batch):
            last = min(copies, first + per_batch - 1)
            params = {
                "first": first,
                "last": last,
                "copies": copies,
                "step": step,
                "open_copies": open_copies,
            }
            with connection.transaction():
                for copy in plan.tables:
                    statement = sql.SQL("INSERT INTO {} ({}) {}").format(
                        sql.Identifier(copy.table),
                        sql.SQL(", ").join(sql.Identifier(c) for c in copy.columns),
                        copy.select(),
                    )
                    connection.execute(statement, params)
            if progress:
                print(f"  copies {first}-{last} of {copies}", flush=True)
        connection.execute("SET session_replication_role = origin")
        copied = time.perf_counter() - started
        if vacuum:
            connection.execute("VACUUM ANALYZE")
        row = connection.execute(
            "SELECT (SELECT count(*) FROM turns), (SELECT count(*) FROM approval_queue)"
        ).fetchone()
        assert row is not None
        mismatches = queue_mismatches(connection)
        if mismatches:
            raise RuntimeError(f"approval_queue differs from the backfill by {mismatches} rows")
    return Growth(
        copies=copies,
        turns=int(row[0]),
        open_approvals=int(row[1]),
        copy_seconds=round(copied, 1),
        vacuum_seconds=round(time.perf_counter() - started - copied, 1),
        embedding={c.table: list(c.embedding) for c in plan.tables if c.embedding},
    )


def build(
    url: str, turns: int, *, seed: int = 300, open_fraction: float = 0.01, **options: Any
) -> Growth:
    """Migrate the empty database at ``url``, run ``seed`` genuine workflows on it, then
    :func:`grow` it to about ``turns`` turns."""
    from stores import migrate

    migrate(url)
    asyncio.run(run_workflows(url, seed, open_fraction=open_fraction))
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    assert database is not None
    return grow(dsn_for(database), turns, **options)


def main(argv: list[str] | None = None) -> int:
    """Build one database and print what it holds; drop it unless ``--keep``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000, help="turns wanted")
    parser.add_argument("--seed", type=int, default=300, help="genuine workflows copied")
    parser.add_argument("--open-fraction", type=float, default=0.01, help="left paused")
    parser.add_argument(
        "--open-approvals",
        type=int,
        help="open approvals in the end (default: the seed's share of every copy)",
    )
    parser.add_argument("--span-days", type=float, default=30, help="history spread over")
    parser.add_argument("--keep", action="store_true", help="keep the database (its name)")
    args = parser.parse_args(argv)
    raise_on_sigterm()
    databases = Databases(f"turnstile_grow_{os.getpid()}")
    try:
        print("machine:", ", ".join(f"{k} {v}" for k, v in machine().items()), flush=True)
        name = databases.create(f"t{args.turns}")
        growth = build(
            url_for(name),
            args.turns,
            seed=args.seed,
            open_fraction=args.open_fraction,
            span=timedelta(days=args.span_days),
            progress=True,
            open_approvals=args.open_approvals,
        )
        print(growth)
        if args.keep:
            databases.created.remove(name)
            print(f"kept database {name}")
    finally:
        databases.close()
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("interrupted; database dropped", file=sys.stderr)
        raise SystemExit(130) from None
