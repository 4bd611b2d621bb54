"""The schema: Alembic owns it, models and migrations agree, and hot queries use indexes."""

from __future__ import annotations

import json
import re
from contextlib import nullcontext
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import make_url

from engine.store import DecisionQuery, RoundRecord
from stores import (
    SchemaNotAtHeadError,
    ensure_at_head,
    fenced,
    migrate,
    snapshots,
    turn_creation,
    turns,
)
from stores import approvals as approval_sql
from stores import turn_claims as claim_sql
from stores.migrate import _config, current_revision, head_revision
from stores.pg import PLANNER_SETTINGS
from stores.schema import metadata
from stores.schema import turns as turns_table
from stores.turn_claims import ClaimRequest, claim_statement
from tests.databases import libpq_dsn, new_sqlite_database, postgres_url
from tests.integration.store_support import asks, tool_call

#: The dialect the claim statements are compiled in to read their plans.
POSTGRESQL = make_url("postgresql+psycopg://").get_dialect()()


def _dsn(url: str) -> str:
    return libpq_dsn(url)


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_alembic_check_finds_models_and_migrations_in_agreement(kind: str) -> None:
    """`alembic check` on a freshly migrated database reports no pending changes."""
    if kind == "postgres":
        with postgres_url() as url:
            command.check(_config(url))
    else:
        command.check(_config(new_sqlite_database()))


def test_downgrade_and_upgrade_round_trip() -> None:
    """The initial migration downgrades to an empty database and upgrades again."""
    with postgres_url() as url:
        command.downgrade(_config(url), "base")
        assert current_revision(url) is None
        with psycopg.connect(_dsn(url)) as connection:
            tables = connection.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename <> 'alembic_version'"
            ).fetchone()
            assert tables == (0,)
        migrate(url)
        assert current_revision(url) == head_revision()


def _table_collations(url: str) -> dict[tuple[str, str], str | None]:
    """The collation of each text column of the database's tables (``None``: the default)."""
    with psycopg.connect(_dsn(url)) as connection:
        rows = connection.execute(
            """SELECT c.table_name, c.column_name, c.collation_name
               FROM information_schema.columns c
               JOIN information_schema.tables t USING (table_schema, table_name)
               WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
                 AND c.data_type = 'text' AND c.table_name <> 'alembic_version'"""
        ).fetchall()
    return {(table, column): collation for table, column, collation in rows}


def test_every_text_column_has_the_collation_the_models_give_it() -> None:
    """A migrated database collates each text column as stores.schema says — the turn ids in
    "C", the others in the database's default — which ``alembic check`` does not compare."""
    dialect = make_url("postgresql+psycopg://").get_dialect()()
    expected = {
        (table.name, column.name): getattr(column.type.dialect_impl(dialect), "collation", None)
        for table in metadata.sorted_tables
        for column in table.columns
        if column.type.compile(dialect).startswith("TEXT")
    }
    assert ("turns", "id") in expected
    with postgres_url() as url:
        assert _table_collations(url) == expected
        # Migration 0021's downgrade restores the default collation everywhere.
        command.downgrade(_config(url), "0020")
        assert set(_table_collations(url).values()) == {None}
        migrate(url)
        assert _table_collations(url) == expected


def test_every_column_holding_a_turn_id_is_collated_as_the_turn_id() -> None:
    """A turn id is compared with the key of ``turns`` wherever it is stored (joins, foreign
    keys): each such column shares its collation, or those comparisons could not use the
    column's own index."""
    dialect = make_url("postgresql+psycopg://").get_dialect()()
    key = getattr(turns_table.c.id.type.dialect_impl(dialect), "collation", None)
    holding = [
        column
        for table in metadata.sorted_tables
        for column in table.columns
        if column.name in ("turn_id", "parent_id")
        or any(fk.column is turns_table.c.id for fk in column.foreign_keys)
        or (table is turns_table and column.name == "id")
    ]
    assert len(holding) >= 9
    assert {
        f"{column.table.name}.{column.name}": getattr(
            column.type.dialect_impl(dialect), "collation", None
        )
        for column in holding
    } == {f"{column.table.name}.{column.name}": key for column in holding}
    assert key == "C"


def test_every_column_holding_a_session_id_is_collated_as_the_session_id() -> None:
    """A session id is compared with the key of ``sessions`` wherever it is stored (the
    reference from ``turns``, the queue's copy): each such column shares its collation, bytes
    on PostgreSQL, so that an id prefix reads the primary key."""
    dialect = make_url("postgresql+psycopg://").get_dialect()()
    key_column = metadata.tables["sessions"].c.id
    holding = [
        column
        for table in metadata.sorted_tables
        for column in table.columns
        if column.name == "session_id" or column is key_column
    ]
    assert {f"{c.table.name}.{c.name}" for c in holding} >= {
        "sessions.id",
        "turns.session_id",
        "approval_queue.session_id",
    }
    assert {
        getattr(column.type.dialect_impl(dialect), "collation", None) for column in holding
    } == {"C"}


def test_a_database_not_at_head_is_refused_with_instructions(tmp_path: Any) -> None:
    """ensure_at_head names the database, its state and the command that fixes it."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(SchemaNotAtHeadError) as refused:
        ensure_at_head(url)
    assert "empty (never migrated)" in str(refused.value)
    assert "turnstile migrate --db" in str(refused.value)
    migrate(url)
    ensure_at_head(url)


def test_turn_status_is_a_postgres_enum_with_exactly_the_five_statuses() -> None:
    """The ENUM turn_status mirrors TurnStatus exactly."""
    with postgres_url() as url, psycopg.connect(_dsn(url)) as connection:
        labels = connection.execute(
            "SELECT enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid "
            "WHERE t.typname = 'turn_status' ORDER BY e.enumsortorder"
        ).fetchall()
    assert [label for (label,) in labels] == [
        "pending",
        "aborting",
        "completed",
        "failed",
        "aborted",
    ]


def _populate(connection: psycopg.Connection[Any], turns: int, *, analyze: bool = True) -> None:
    """Many settled turns with finished tool calls, plus a few pending and paused ones."""
    statements = [
        """INSERT INTO sessions (id, agent, created_at, updated_at)
           SELECT 's' || g, 'bankingAgent', now(), now() FROM generate_series(1, %(n)s) g""",
        """INSERT INTO turns (id, session_id, seq, agent, status, finish_reason, input,
                              history_length, run_after, created_at, updated_at)
           SELECT 't' || g, 's' || g, 1, 'bankingAgent',
                  CASE WHEN g %% 1000 = 0 THEN 'pending'::turn_status
                       ELSE 'completed'::turn_status END,
                  CASE WHEN g %% 1000 = 500 THEN 'interrupted' ELSE 'stop' END,
                  '{"kind": "message"}', 0, now(), now(), now()
           FROM generate_series(1, %(n)s) g""",
        """INSERT INTO tool_calls (turn_id, round, ref, name, input, status, idempotency_key,
                                   created_at)
           SELECT 't' || g, 1, 'approval-1', 'userApproval', '{}',
                  CASE WHEN g %% 1000 = 500 THEN 'interrupted'::tool_call_status
                       ELSE 'answered'::tool_call_status END,
                  't' || g || ':approval-1', now()
           FROM generate_series(1, %(n)s) g""",
    ]
    for statement in statements:
        connection.execute(statement, {"n": turns})
    if analyze:
        connection.execute("ANALYZE")


def _plan(connection: psycopg.Connection[Any], sql: str) -> tuple[set[str], set[str]]:
    """The indexes and the tables the plan of ``sql`` reads."""
    (plan,) = connection.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchone()  # type: ignore[misc]
    nodes = _plan_nodes(plan)
    indexes = {node["Index Name"] for node in nodes if "Index Name" in node}
    tables = {node["Relation Name"] for node in nodes if "Relation Name" in node}
    return indexes, tables


def _plan_nodes(plan: Any) -> list[dict[str, Any]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` result (parsed or not), top-down."""
    nodes: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"])
    return nodes


def test_claim_and_open_approvals_queries_use_their_indexes() -> None:
    """With 50,000 turns the claim scans its partial index, a claim of named turns uses the
    primary key alone, and open approvals read only the approval queue, in the order of its
    created_at index."""
    with postgres_url() as url, psycopg.connect(_dsn(url), autocommit=True) as connection:
        _populate(connection, 50_000)
        claim = claim_statement(
            ClaimRequest(owner="w", lease_seconds=30, now=datetime.now(UTC), limit=8)
        ).compile(dialect=POSTGRESQL, compile_kwargs={"literal_binds": True})
        assert "ix_turns_claimable" in _plan(connection, str(claim))[0]
        # A pool woken by a work notification claims the named turns by primary key only:
        # scanning the claim index would step over its dead entries.
        request = ClaimRequest(
            owner="w", lease_seconds=30, now=datetime.now(UTC), limit=8, turn_ids=["t1", "t2"]
        )
        named = claim_statement(request).compile(
            dialect=POSTGRESQL, compile_kwargs={"literal_binds": True}
        )
        assert _plan(connection, str(named))[0] == {"pk_turns"}
        # The queue holds only the 50 open approvals: on so small a table the planner rightly
        # prefers a sequential scan and a sort. Disabling sequential scans for this session
        # asks whether an index can deliver the view's order; with the queue's created_at
        # index gone (or the view reading the journal again) this fails.
        connection.execute("SET enable_seqscan = off")
        indexes, tables = _plan(connection, "SELECT * FROM open_approvals ORDER BY created_at")
        assert indexes == {"ix_approval_queue_created_at"}
        assert tables == {"approval_queue"}
        rows = connection.execute("SELECT count(*) FROM open_approvals").fetchone()
        assert rows == (50,)


def _history_page_explained(url: str, query: DecisionQuery, explain: str) -> list[Any]:
    """The rows of ``explain`` for the history's page for ``query``: ``list_decisions`` runs on
    a real connection, and its statement is explained as sent, with the same parameters."""
    sent: list[tuple[str, Any]] = []

    def record(*arguments: Any) -> None:
        _, _, statement, parameters, _, _ = arguments
        sent.append((statement, parameters))

    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            sa.event.listen(connection, "before_cursor_execute", record)
            approval_sql.list_decisions(connection, query)
            sa.event.remove(connection, "before_cursor_execute", record)
            statement, parameters = sent[0]  # the page; a second one reads the resumes
            assert "ORDER BY" in statement, statement
            return list(connection.exec_driver_sql(f"{explain} {statement}", parameters))
    finally:
        engine.dispose()


def _history_page_plan(url: str, query: DecisionQuery) -> list[dict[str, Any]]:
    """The PostgreSQL plan nodes of the history's page for ``query``."""
    [(plan,)] = _history_page_explained(url, query, "EXPLAIN (FORMAT JSON)")
    return _plan_nodes(plan)


def _reads_the_history_index_backwards(nodes: list[dict[str, Any]]) -> bool:
    """Whether the plan walks ix_tool_calls_decided newest first and sorts no journal rows
    (the resume's subquery sorts a paused turn's few children, which is not the page)."""
    scans = [n for n in nodes if n.get("Index Name") == "ix_tool_calls_decided"]
    sorted_tables = {
        below.get("Relation Name")
        for sort in nodes
        if sort["Node Type"] in ("Sort", "Incremental Sort")
        for below in _plan_nodes([{"Plan": sort}])
    }
    walks = [(n["Node Type"], n.get("Scan Direction")) for n in scans]
    return walks == [("Index Scan", "Backward")] and "tool_calls" not in sorted_tables


def test_the_history_of_decisions_pages_through_its_index() -> None:
    """With 5,000 decided approvals among 20,000 journal rows, the history's first page and a
    later keyset page each read ix_tool_calls_decided backwards from the cursor (the keyset in
    the index condition), never scanning and sorting the decided rows; without the index they
    do, so the check tells the two apart."""
    with postgres_url() as url:
        with psycopg.connect(_dsn(url), autocommit=True) as connection:
            _populate(connection, 20_000, analyze=False)
            connection.execute(
                """UPDATE tool_calls
                   SET answer = '{"respond": true}', decided_by = 'alice',
                       decided_at = now() - substr(turn_id, 2)::int * interval '1 second'
                   WHERE substr(turn_id, 2)::int % 4 = 0"""
            )
            connection.execute("ANALYZE")
        first = _history_page_plan(url, DecisionQuery())
        cursor = (datetime.now(UTC), "t10000", "approval-1")
        later = _history_page_plan(url, DecisionQuery(before=cursor))
        with psycopg.connect(_dsn(url), autocommit=True) as connection:
            connection.execute("DROP INDEX ix_tool_calls_decided")
        unindexed = _history_page_plan(url, DecisionQuery())

    assert _reads_the_history_index_backwards(first), json.dumps(first, indent=1)
    assert _reads_the_history_index_backwards(later), json.dumps(later, indent=1)
    [keyset] = [n for n in later if n.get("Index Name") == "ix_tool_calls_decided"]
    assert "decided_at, turn_id, ref" in keyset.get("Index Cond", ""), keyset
    assert not _reads_the_history_index_backwards(unindexed), json.dumps(unindexed, indent=1)


def test_the_history_of_decisions_reads_its_index_on_sqlite() -> None:
    """On SQLite too the history's page searches ix_tool_calls_decided in its order: the only
    sort left is the resume's subquery's, over a paused turn's children."""
    rows = _history_page_explained(new_sqlite_database(), DecisionQuery(), "EXPLAIN QUERY PLAN")
    steps = [row[3] for row in rows]
    assert "SEARCH tool_calls USING INDEX ix_tool_calls_decided (decided_at>?)" in steps, steps
    assert steps.count("USE TEMP B-TREE FOR ORDER BY") == 1, steps
    assert steps.index("USE TEMP B-TREE FOR ORDER BY") > steps.index(
        "CORRELATED SCALAR SUBQUERY 1"
    ), steps


def _explained(
    connection: psycopg.Connection[Any], statement: Any, values: Any, *, prepare: bool, runs: int
) -> str:
    """auto_explain's plan (with ANALYZE) of the last of ``runs`` executions of
    ``statement``, read from its notices."""
    notices: list[str] = []
    connection.add_notice_handler(lambda notice: notices.append(notice.message_primary or ""))
    connection.execute("LOAD 'auto_explain'")
    connection.execute("SET auto_explain.log_min_duration = 0")
    connection.execute("SET auto_explain.log_analyze = on")
    connection.execute("SET client_min_messages = log")
    named = dict(zip(statement.parameter_names, statement.arguments(values), strict=True))
    for _ in range(runs):
        connection.execute(statement.sql, named, prepare=prepare)
    connection.execute("RESET client_min_messages")
    return notices[-1]


def _generic_plan(connection: psycopg.Connection[Any], statement: Any, values: Any) -> str:
    """The plan ``statement`` runs with once its plan is cached for any values, with
    stores/pg.py's connection settings."""
    for name, value in PLANNER_SETTINGS.items():
        connection.execute(f"SET {name} = {value}")
    # psycopg prepares it (prepare=True), then it runs from the cache
    return _explained(connection, statement, values, prepare=True, runs=3)


def _generic_plan_scans(connection: psycopg.Connection[Any], statement: Any, values: Any) -> str:
    """The scan lines of :func:`_generic_plan`."""
    plan = _generic_plan(connection, statement, values)
    return "\n".join(line for line in plan.splitlines() if "Scan" in line)


def _hot_path_reads() -> dict[str, tuple[Any, dict[str, Any]]]:
    """The claims and reads of the common path, with values for _populate's turns."""
    now = datetime.now(UTC)
    claim = {
        "now": now,
        "expires": now,
        "owner": "w",
        "limit": 8,
        "agents": ["a"],
        "versions": ["v1"],
    }
    return {
        "claim by id": (
            claim_sql._CHECKED_CLAIMS[True, True, True],
            {**claim, "turn_ids": ["t1000", "t2000"]},
        ),
        "claim": (claim_sql._CHECKED_CLAIMS[True, False, True], claim),
        "snapshot": (snapshots._SNAPSHOT, {"turn_id": "t500"}),
        "progress": (snapshots._PROGRESS, {"turn_id": "t500"}),
        # The leased ids come from a setting its claim made (none here: the plan is the same).
        "claimed progress": (claim_sql.CLAIMED_PROGRESS, {}),
        "turn": (turns._PG_BY_ID, {"turn_id": "t500"}),
    }


def test_the_common_paths_cached_plans_use_indexes() -> None:
    """With 50,000 turns, the claims, the snapshot and progress reads (also the claim's) and
    the turn read each plan index scans even when planned once for any values (a plan cached
    by a connection), and never a sequential scan of turns, messages or tool_calls."""
    with postgres_url() as url, psycopg.connect(_dsn(url), autocommit=True) as connection:
        _populate(connection, 50_000)
        connection.execute(
            """INSERT INTO messages (turn_id, round, position, role, content, committed,
                                     created_at)
               SELECT id, 0, 0, 'user', '[]', true, now() FROM turns"""
        )
        connection.execute("ANALYZE messages")
        cases = _hot_path_reads()
        plans = {
            name: _generic_plan_scans(connection, statement, values)
            for name, (statement, values) in cases.items()
        }

    assert "ix_turns_claimable" not in plans["claim by id"]
    assert "pk_turns" in plans["claim by id"]
    assert "ix_turns_claimable" in plans["claim"]
    # An index scan, in the index's order: a bitmap scan would visit the heap page of every
    # dead entry the claim index holds until the next vacuum, on every claim.
    assert "Index Scan using ix_turns_claimable" in plans["claim"], plans["claim"]
    assert "Bitmap" not in plans["claim"], plans["claim"]
    assert "ix_turns_aborting" in plans["claim"]
    assert "pk_messages" in plans["snapshot"]
    assert "pk_turns" in plans["claimed progress"]
    assert "pk_turns" in plans["turn"]
    for name, plan in plans.items():
        assert "Seq Scan" not in plan, f"{name}:\n{plan}"


#: An analysed plan node's output: "(actual time=... rows=N loops=L)".
_ACTUAL_ROWS = re.compile(r"actual time=\S+ rows=(\d+) loops=(\d+)")


def test_a_journal_write_reads_only_its_own_turns_rows() -> None:
    """A lease holder's write of a round and its journal, planned once on empty tables as a
    new deployment's first write is, then run with 5,000 turns' messages and journal rows,
    reads a handful of them through their keys: a plan that checked the written rows against
    the whole table would grow every write with the history (a form without upserts did,
    until its lookups named the turn id parameter)."""
    round = RoundRecord(round=1, messages=[asks("approval-1"), asks("r2")], committed=True)
    calls = [tool_call("t1000", 1, "approval-1"), tool_call("t1000", 1, "r2")]
    values = {
        **fenced._write_params("t1000", [round], calls, datetime.now(UTC)),
        "lease_token": 7,
    }
    statement = fenced._save_statement(round=True, calls=True, usage=False, state=False)
    with postgres_url() as url, psycopg.connect(_dsn(url), autocommit=True) as connection:
        for table in ("turns", "messages", "tool_calls", "sessions"):
            connection.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        _generic_plan(connection, statement, values)  # cached now, on empty tables
        _populate(connection, 5_000, analyze=False)
        connection.execute(
            """INSERT INTO messages (turn_id, round, position, role, content, committed,
                                     created_at)
               SELECT id, 1, 0, 'model', '[]', false, now() FROM turns"""
        )
        connection.execute("UPDATE turns SET lease_token = 7 WHERE id = 't1000'")
        plan = _explained(connection, statement, values, prepare=True, runs=1)
        written = connection.execute(
            "SELECT (SELECT count(*) FROM messages WHERE turn_id = 't1000'),"
            " (SELECT count(*) FROM tool_calls WHERE turn_id = 't1000')"
        ).fetchone()

    assert written == (2, 2)
    assert "Seq Scan" not in plan, plan
    scans = [line for line in plan.splitlines() if re.search(r"on (messages|tool_calls)", line)]
    assert scans, plan
    for line in scans:
        found = _ACTUAL_ROWS.search(line)
        assert found is not None, line
        assert int(found[1]) * int(found[2]) <= 4, plan


def test_plans_cached_while_the_tables_were_empty_still_use_the_indexes() -> None:
    """A worker prepares its statements at their first run, which on a new deployment (and
    in every benchmark run) is when the tables are empty, and keeps those plans until an
    ANALYZE of the table invalidates them: autovacuum's first one comes a minute or more
    later. With thousands of turns by then, the claims and reads must still probe their
    indexes; a sequential scan the planner chose for an empty table cost the by-id claim
    2 ms instead of 0.1 ms (the benchmark's idle pickups doubled)."""
    with postgres_url() as url, psycopg.connect(_dsn(url), autocommit=True) as connection:
        for table in ("turns", "messages", "tool_calls", "sessions"):
            connection.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        cases = _hot_path_reads()
        for statement, values in cases.values():  # cached now, on empty tables
            _generic_plan(connection, statement, values)
        _populate(connection, 5_000, analyze=False)
        plans = {
            name: _explained(connection, statement, values, prepare=True, runs=1)
            for name, (statement, values) in cases.items()
        }

    for name, plan in plans.items():
        assert "Seq Scan" not in plan, f"{name}:\n{plan}"


def test_a_resume_finds_its_answers_by_the_parents_key_however_many_approvals_are_open() -> None:
    """The resume's creation marks the answered calls by the parent turn's journal key. Given
    only the answer rows, the planner hash-joined the whole open-approval index with them
    instead: every resume then read every open approval of every session (5,000 here)."""
    with postgres_url() as url, psycopg.connect(_dsn(url), autocommit=True) as connection:
        _populate(connection, 50_000, analyze=False)
        connection.execute(
            "UPDATE tool_calls SET status = 'interrupted' WHERE turn_id LIKE '%0'"
        )  # one call in ten waits for an answer
        connection.execute("ANALYZE")
        for name, value in PLANNER_SETTINGS.items():
            connection.execute(f"SET {name} = {value}")
        statement = turn_creation._CREATE[True, False, False]
        connection.execute(b"PREPARE resume AS " + statement.wire_sql)
        literals = {
            "agent": "'bankingAgent'",
            "owner": "NULL",
            "session_id": "'s500'",
            "now": "now()",
            "answers": """'[{"turn_id": "t500", "round": 1, "ref": "approval-1"}]'""",
            "answer_count": "1",
            "id": "'new'",
            "parent_id": "'t500'",
            "expected_latest_id": "'t500'",
            "input": """'{"kind": "resume"}'""",
            "history_length": "1",
            "max_attempts": "3",
            "trace_context": "NULL",
            "custom": "NULL",
            "artifacts": "NULL",
            "app_version": "'v1'",
            "definition_fingerprint": "'def-0'",
            "note": "NULL",
            "work_channel": "'turnstile_work'",
        }
        arguments = ", ".join(literals[name] for name in statement.parameter_names)
        rows = connection.execute(f"EXPLAIN EXECUTE resume({arguments})").fetchall()
    plan = "\n".join(row[0] for row in rows)
    answered = plan[plan.index("CTE answered") : plan.index("CTE created")]
    ready = plan[plan.index("CTE ready") : plan.index("CTE session")]

    assert "pk_tool_calls" in answered, answered
    assert "ix_tool_calls_open" not in answered, answered
    assert "ix_tool_calls_open" not in ready, ready


def test_a_new_databases_queue_claim_walks_its_index_in_order() -> None:
    """Before the first ANALYZE (a new deployment, and every benchmark run), with thousands
    of turns that were pending and are settled now, the queue claim still reads its
    partial index by an ordered index scan: the bitmap scan the planner picks there by
    default visits the heap page of every dead entry, on every claim."""
    with postgres_url() as url, psycopg.connect(_dsn(url), autocommit=True) as connection:
        connection.execute("ALTER TABLE turns SET (autovacuum_enabled = false)")  # no stats
        connection.execute(
            """INSERT INTO sessions (id, agent, created_at, updated_at)
               SELECT 's' || g, 'a', now(), now() FROM generate_series(1, 3000) g"""
        )
        connection.execute(
            """INSERT INTO turns (id, session_id, seq, agent, status, input, history_length,
                                  run_after, created_at, updated_at)
               SELECT 't' || g, 's' || g, 1, 'a', 'pending', '{"kind": "message"}', 0,
                      now(), now(), now()
               FROM generate_series(1, 3000) g"""
        )
        connection.execute("UPDATE turns SET status = 'completed' WHERE id <> 't3000'")
        now = datetime.now(UTC)
        claim = {
            "now": now,
            "expires": now,
            "owner": "w",
            "limit": 8,
            "agents": ["a"],
            "versions": ["v1"],
        }
        plan = _generic_plan_scans(connection, claim_sql._CHECKED_CLAIMS[True, False, True], claim)
    assert "Index Scan using ix_turns_claimable" in plan, plan
    assert "Bitmap" not in plan, plan


def test_the_common_paths_statements_are_never_jit_compiled() -> None:
    """The claims and the snapshot and progress reads are never JIT-compiled, however
    costly their cached plan looks: PostgreSQL compiles again on every execution, and with
    26,000 turns the generic plan of the snapshot read was past the default jit_above_cost,
    and every read took 8 ms (0.1 ms without). Here every plan passes the
    threshold (jit_above_cost = 0, set before the connection's own settings)."""
    with postgres_url() as url, psycopg.connect(_dsn(url), autocommit=True) as connection:
        (available,) = connection.execute("SELECT pg_jit_available()").fetchone()  # type: ignore[misc]
        _populate(connection, 2_000)
        connection.execute("SET jit_above_cost = 0")
        now = datetime.now(UTC)
        claim = {
            "now": now,
            "expires": now,
            "owner": "w",
            "limit": 8,
            "agents": ["a"],
            "versions": ["v1"],
        }
        cases = {
            "claim by id": (
                claim_sql._CHECKED_CLAIMS[True, True, True],
                {**claim, "turn_ids": ["t1"]},
            ),
            "claim": (claim_sql._CHECKED_CLAIMS[True, False, True], claim),
            "snapshot": (snapshots._SNAPSHOT, {"turn_id": "t500"}),
            "progress": (snapshots._PROGRESS, {"turn_id": "t500"}),
        }
        plans = {
            name: _generic_plan(connection, statement, values)
            for name, (statement, values) in cases.items()
        }
        connection.execute("RESET jit")  # what an unset connection would do here
        # Not the prepared statement _generic_plan left: its plan was made with JIT off.
        unset = _explained(
            connection, snapshots._SNAPSHOT, {"turn_id": "t500"}, prepare=False, runs=1
        )
    for name, plan in plans.items():
        assert "JIT" not in plan, f"{name}:\n{plan}"
    if available:  # the check can fail: a connection left to the defaults compiles
        assert "JIT" in unset, unset


def test_escalation_chains_migration_sets_the_step_of_approvals_escalated_before() -> None:
    """Migration 0015 records an approval escalated under the one-group rule as at step 1
    and one never escalated at step 0, and its downgrade drops the column again."""
    with postgres_url() as url:
        command.downgrade(_config(url), "0015-1")
        with psycopg.connect(_dsn(url)) as connection:
            assert connection.execute(
                "SELECT count(*) FROM information_schema.columns "
                "WHERE table_name = 'approval_assignments' AND column_name = 'escalation_step'"
            ).fetchone() == (0,)
            # The journal rows these would belong to are beside the point: no FK checks.
            connection.execute("SET session_replication_role = replica")
            connection.execute(
                "INSERT INTO approval_assignments (turn_id, round, ref, assigned_group, "
                "escalated_at, escalated_to) VALUES "
                "('moved', 1, 'a', 'leads', now(), 'leads'), ('waiting', 1, 'a', 'payments', "
                "NULL, NULL)"
            )
        migrate(url)
        with psycopg.connect(_dsn(url)) as connection:
            steps = connection.execute(
                "SELECT turn_id, escalation_step FROM approval_assignments ORDER BY turn_id"
            ).fetchall()
        assert steps == [("moved", 1), ("waiting", 0)]


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_call_history_migration_drops_the_journal_triggers_and_its_downgrade_restores_them(
    kind: str,
) -> None:
    """Migration 0020 leaves ``tool_calls`` without the history triggers of 0013 (the
    writers append the entries), and its downgrade puts them back for the code before it."""
    query = (
        "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
        "AND tgrelid = 'tool_calls'::regclass AND tgname LIKE '%history%' ORDER BY tgname"
        if kind == "postgres"
        else "SELECT name FROM sqlite_master WHERE type = 'trigger' "
        "AND tbl_name = 'tool_calls' AND name LIKE '%history%' ORDER BY name"
    )

    def history_triggers(url: str) -> list[str]:
        engine = sa.create_engine(url)
        try:
            with engine.connect() as connection:
                return list(connection.execute(sa.text(query)).scalars())
        finally:
            engine.dispose()

    database = postgres_url() if kind == "postgres" else nullcontext(new_sqlite_database())
    with database as url:
        assert history_triggers(url) == []
        command.downgrade(_config(url), "0020-1")
        assert history_triggers(url) == ["tool_calls_history_insert", "tool_calls_history_update"]
        migrate(url)
        assert history_triggers(url) == []


def _history_keys(url: str) -> tuple[list[str], list[str], str]:
    """``turn_events``' primary-key columns, its other indexes and the type of its ``id``."""
    with psycopg.connect(_dsn(url)) as connection:
        key = connection.execute(
            "SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i "
            "CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = 'turn_events'::regclass AND i.indisprimary"
        ).fetchone()
        others = connection.execute(
            "SELECT indexrelid::regclass::text FROM pg_index "
            "WHERE indrelid = 'turn_events'::regclass AND NOT indisprimary ORDER BY 1"
        ).fetchall()
        id_type = connection.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 'turn_events'::regclass AND attname = 'id'"
        ).fetchone()
    assert key is not None and id_type is not None
    return list(key[0]), [row[0] for row in others], str(id_type[0])


def test_the_history_is_keyed_by_turn_on_postgres_and_its_downgrade_restores_both_keys() -> None:
    """Migration 0023 keys ``turn_events`` by ``(turn_id, id)`` with a 64-bit ``id`` and no
    second index; the downgrade brings back the key on ``id`` and the index by turn, and the
    history written meanwhile keeps its entries and its order."""
    with postgres_url() as url:
        assert _history_keys(url) == (["turn_id", "id"], [], "bigint")
        with psycopg.connect(_dsn(url)) as connection:
            _populate(connection, 1, analyze=False)
            connection.execute(
                "INSERT INTO turn_events (turn_id, to_status, attempt, at) "
                "VALUES ('t1', 'pending', 0, now())"
            )
            # Beyond the 32-bit range the identity had before.
            connection.execute(
                "INSERT INTO turn_events (id, turn_id, to_status, attempt, at) "
                "VALUES (3000000000, 't1', 'completed', 1, now())"
            )
        command.downgrade(_config(url), "0022")
        assert _history_keys(url) == (["id"], ["ix_turn_events_turn_id"], "bigint")
        migrate(url)
        assert _history_keys(url) == (["turn_id", "id"], [], "bigint")
        with psycopg.connect(_dsn(url)) as connection:
            ids = connection.execute(
                "SELECT seq FROM turn_timeline WHERE turn_id = 't1' ORDER BY seq"
            ).fetchall()
        assert len(ids) == 2 and ids[-1][0] == 3000000000
