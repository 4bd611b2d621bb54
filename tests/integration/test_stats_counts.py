"""``turnstile stats``' counts of turns by status (docs/cli.md, "turnstile stats"): the open
statuses are always exact; on PostgreSQL the settled ones (which grow with history) are
estimates from the planner's statistics of ``turns``, labelled as such, unless the table was
never analyzed or an exact count is asked for; SQLite counts everything exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from stores import operations as operation_sql
from stores.operations import Stats
from tests.databases import libpq_dsn, new_sqlite_database, postgres_url

#: Turns of the small history, by status: every status several times.
HISTORY = {"completed": 900, "failed": 60, "aborted": 30, "pending": 8, "aborting": 2}
SETTLED = ["completed", "failed", "aborted"]


def _insert(execute: Any, counts: dict[str, int]) -> None:
    """``counts`` turns per status, each its own session's only turn, through ``execute``
    (a statement without parameters)."""
    number = 0
    for status, count in counts.items():
        for g in range(1, count + 1):
            number += 1
            execute(
                "INSERT INTO sessions (id, agent, created_at, updated_at) VALUES"
                f" ('{status}{g}', 'a', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
            execute(
                "INSERT INTO turns (id, session_id, seq, agent, status, input, history_length,"
                " run_after, created_at, updated_at) VALUES"
                f" ('t{number}', '{status}{g}', 1, 'a', '{status}', '{{}}', 0,"
                " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )


def _postgres_history(url: str, counts: dict[str, int]) -> None:
    """``counts`` in ``url``'s database, autovacuum kept off ``turns`` so that only the test
    decides when its statistics are gathered."""
    with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
        connection.execute("ALTER TABLE turns SET (autovacuum_enabled = false)")
        with connection.transaction():
            _insert(connection.execute, counts)


def _analyze(url: str) -> None:
    with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
        connection.execute("ANALYZE turns")


def _stats(url: str, *, exact: bool = False) -> Stats:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            return operation_sql.read_stats(connection, datetime.now(UTC), exact=exact)
    finally:
        engine.dispose()


def _counted(url: str) -> dict[str, int]:
    """The turns per status, counted here with SQL of the test's own."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            rows = connection.exec_driver_sql("SELECT status, count(*) FROM turns GROUP BY status")
            counted = {str(status): int(total) for status, total in rows}
    finally:
        engine.dispose()
    return {status: counted.get(status, 0) for status in HISTORY}


def test_a_never_analyzed_table_is_counted_exactly() -> None:
    """Without statistics (a new table, autovacuum not yet past it) every count is exact and
    none is labelled an estimate."""
    with postgres_url() as url:
        _postgres_history(url, HISTORY)
        stats = _stats(url)
        assert stats.turns == HISTORY
        assert (stats.estimated, stats.analyzed_at) == ([], None)


def test_after_analyze_the_settled_statuses_are_labelled_estimates() -> None:
    """Once analyzed, completed, failed and aborted are estimates said to be so, with when
    the statistics were gathered; the open statuses stay exact, also after more turns are
    written that the statistics do not know about."""
    with postgres_url() as url:
        _postgres_history(url, HISTORY)
        before = datetime.now(UTC)
        _analyze(url)
        stats = _stats(url)
        assert stats.estimated == SETTLED
        assert stats.analyzed_at is not None and stats.analyzed_at >= before
        # A table this small is sampled whole: the estimates are its counts.
        assert stats.turns == HISTORY

        more = {"completed": 0, "failed": 0, "aborted": 0, "pending": 5, "aborting": 0}
        with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
            connection.execute("UPDATE turns SET status = 'completed' WHERE status = 'aborting'")
            connection.execute(
                "INSERT INTO sessions (id, agent, created_at, updated_at)"
                " SELECT 'more' || g, 'a', now(), now() FROM generate_series(1, 5) g"
            )
            connection.execute(
                "INSERT INTO turns (id, session_id, seq, agent, status, input, history_length,"
                " run_after, created_at, updated_at) SELECT 'more' || g, 'more' || g, 1, 'a',"
                " 'pending', '{}', 0, now(), now(), now() FROM generate_series(1, 5) g"
            )
        later = _stats(url)
        assert later.turns["pending"] == HISTORY["pending"] + more["pending"]
        assert later.turns["aborting"] == 0
        assert later.estimated == SETTLED


def test_exact_counts_equal_a_count_of_every_turn() -> None:
    """``exact`` counts every status as a count of the table does, statistics or not, and
    labels nothing an estimate, even when the statistics are out of date."""
    with postgres_url() as url:
        _postgres_history(url, HISTORY)
        _analyze(url)
        with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
            connection.execute("UPDATE turns SET status = 'failed' WHERE id < 't500'")
        stats = _stats(url, exact=True)
        assert stats.turns == _counted(url)
        assert stats.turns != HISTORY  # the statistics still say HISTORY
        assert (stats.estimated, stats.analyzed_at) == ([], None)
        # Without exact, the statistics, which have not seen the update, still answer.
        assert _stats(url).turns["failed"] < stats.turns["failed"]


@pytest.mark.parametrize("exact", [False, True])
def test_sqlite_counts_exactly(exact: bool) -> None:
    """The embedded database is counted exactly, whichever is asked."""
    url = new_sqlite_database()
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.begin() as connection:
            _insert(connection.exec_driver_sql, HISTORY)
            connection.exec_driver_sql("ANALYZE")
    finally:
        engine.dispose()
    stats = _stats(url, exact=exact)
    assert stats.turns == HISTORY
    assert (stats.estimated, stats.analyzed_at) == ([], None)
