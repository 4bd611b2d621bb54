"""The statement budget (``bench/statement_budget.py``) ranks each normalized statement's cost
per workflow, keeps the trigger functions' statements apart from the statements the clients
sent, and runs on a private PostgreSQL instance that it deletes afterwards."""

from __future__ import annotations

import psycopg
import pytest

from bench import common
from bench.statement_budget import (
    RelationWal,
    StatementStats,
    Totals,
    budget,
    private_server,
    read_statements,
    read_wal_by_relation,
    render,
)


def _row(
    query: str, *, toplevel: bool = True, calls: int, ms: float, wal: int = 0
) -> StatementStats:
    return StatementStats(
        queryid=str(hash((query, toplevel))),
        toplevel=toplevel,
        query=query,
        calls=calls,
        rows=calls,
        total_exec_ms=ms,
        plans=1,
        total_plan_ms=ms / 10,
        wal_bytes=wal,
        blocks_hit=3 * calls,
        blocks_dirtied=calls,
    )


# A recorded shape: a claim, a settle whose trigger appends a history row, and the same read
# reported under two query ids (as happens when one statement is planned for two search paths).
SAMPLE = [
    _row("UPDATE turns SET status = $1\n   WHERE id = $2", calls=20, ms=8.0, wal=4000),
    _row("INSERT INTO turn_events (turn_id) VALUES (NEW.id)", toplevel=False, calls=20, ms=2.0),
    _row("SELECT * FROM turns WHERE id = $1", calls=30, ms=1.0),
    _row("SELECT  *  FROM turns WHERE id = $1", calls=10, ms=1.0),
]
TOTALS = Totals(
    workflows=10,
    seconds=2.0,
    commits=50,
    write_xacts=20,
    wal_bytes=9000,
    wal_records=600,
    wal_fpi=5,
    server_cpu_s=0.05,
    errors=0,
)


def test_the_budget_is_per_workflow_ranked_and_shares_the_top_level_total() -> None:
    """Figures are divided by the workflows, rows of one normalized statement are merged,
    the most expensive statement comes first, and a nested statement's share is of the
    top-level total (its time is already inside its parent's)."""
    result = budget("sample", SAMPLE, TOTALS)
    names = [line.name for line in result.lines]
    assert names == [
        "UPDATE turns SET status = $1 WHERE id = $2",
        "INSERT INTO turn_events (turn_id) VALUES (NEW.id)",
        "SELECT * FROM turns WHERE id = $1",
    ]
    update, event, read = result.lines
    assert (update.calls, update.ms, update.wal_bytes, update.share) == (2.0, 0.8, 400.0, 0.8)
    assert event.nested and event.share == pytest.approx(0.2)
    assert (read.calls, read.ms, read.mean_ms) == (4.0, 0.2, 0.05)
    assert result.round_trips == 6.0 and result.top_level_ms == pytest.approx(1.0)


def test_the_rendered_budget_prints_the_totals_and_filters_rare_statements() -> None:
    """The printed table leads with the per-workflow totals and leaves out statements called
    less often than asked (start-up and polling statements)."""
    text = render(budget("sample", SAMPLE, TOTALS), min_calls=3.0)
    summary, header, _rule, *rows = text.splitlines()
    assert (
        "commits 5.00" in summary
        and "WAL 900 B (60 records" in summary
        and "server CPU 5.00 ms" in summary
    )
    assert header.split()[:3] == ["#", "level", "calls"]
    assert len(rows) == 1 and rows[0].endswith("SELECT * FROM turns WHERE id = $1")


def test_the_rendered_budget_ranks_the_wal_by_relation() -> None:
    """The WAL table is per workflow, largest first, with each relation's share of the run's
    WAL; relations that wrote less than a byte per workflow are left out."""
    wal = [
        RelationWal("pk_turns", records=40, bytes=2000, fpi_bytes=0),
        RelationWal("turns", records=60, bytes=6000, fpi_bytes=1000),
        RelationWal("pg_class", records=1, bytes=5, fpi_bytes=0),
    ]
    text = render(budget("sample", SAMPLE, TOTALS, wal=wal))
    table = text.split("WAL per workflow")[1].splitlines()
    assert [line.split()[0] for line in table[2:]] == ["turns", "pk_turns"]
    assert table[2].split()[1:] == ["6.00", "600", "100", "66.7%"]


def test_the_wal_of_a_range_is_attributed_to_the_tables_and_indexes_written() -> None:
    """Each WAL record of a range counts for the relation its first block belongs to, named
    as the measured database knows it; commit records count under their resource manager."""
    with private_server():
        databases = common.Databases("budget_wal_test")
        try:
            name = databases.create("one")
            with psycopg.connect(common.dsn_for(name), autocommit=True) as connection:
                connection.execute("CREATE TABLE t (id int PRIMARY KEY, body text)")
                position = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"
                start = int(connection.execute(position).fetchone()[0])  # type: ignore[index]
                for value in range(50):
                    connection.execute("INSERT INTO t VALUES (%s, repeat('x', 100))", (value,))
                end = int(connection.execute(position).fetchone()[0])  # type: ignore[index]
            wal = {r.relation: r for r in read_wal_by_relation(name, start, end)}
        finally:
            databases.close()
    assert wal["t"].records >= 50 and wal["t"].bytes >= 50 * 100
    assert wal["t_pkey"].records >= 50
    assert wal["(Transaction)"].records >= 50


def test_the_private_instance_reports_trigger_statements_and_is_deleted() -> None:
    """A private instance tracks the statements a trigger function runs (``track = all``),
    is the admin server of the benchmark's helpers while it runs, and leaves nothing behind."""
    shared = common.ADMIN_URL
    with private_server() as server:
        assert common.ADMIN_URL == server.dsn != shared
        databases = common.Databases("budget_test")
        try:
            name = databases.create("one")
            with common.admin() as connection:
                connection.execute("SELECT pg_stat_statements_reset()")
            with (
                common.admin() as admin,
                psycopg.connect(common.dsn_for(name), autocommit=True) as connection,
            ):
                connection.execute(
                    """CREATE TABLE t (id int PRIMARY KEY);
                       CREATE TABLE log (id int);
                       CREATE FUNCTION t_log() RETURNS trigger LANGUAGE plpgsql AS $$
                       BEGIN INSERT INTO log VALUES (NEW.id); RETURN NEW; END $$;
                       CREATE TRIGGER t_log AFTER INSERT ON t FOR EACH ROW
                       EXECUTE FUNCTION t_log()"""
                )
                for value in range(3):
                    connection.execute("INSERT INTO t VALUES (%s)", (value,))
                statements = read_statements(admin, name)
        finally:
            databases.close()
        assert server.cpu_seconds() > 0
        folder = server.folder
    assert not folder.exists()
    assert shared == common.ADMIN_URL
    levels = {(s.toplevel, s.query.split("(")[0].strip()): s.calls for s in statements}
    assert levels[(True, "INSERT INTO t VALUES")] == 3
    assert levels[(False, "INSERT INTO log VALUES")] == 3
