"""The operators' reads (``turnstile turns ls``, ``turnstile stats``) and the metrics' scrape
cost their page, not the history kept: on PostgreSQL, with enough history that a full read
would be the planner's choice, each exact statement visits only a few rows of ``turns``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from engine.store import DecisionQuery
from stores import approvals as approval_sql
from stores import operations as operation_sql
from stores import retention as retention_sql
from stores import turn_versions as version_sql
from stores.monitoring import MonitoringDatabase
from stores.operations import PAUSED, TurnQuery
from tests.databases import libpq_dsn, postgres_url

#: Sessions of the history: each paused once and resumed, so its first turn stays
#: ``completed`` / ``interrupted`` with a later turn after it.
SESSIONS = 20_000
#: Every OPEN_EVERY-th session is paused now: its interrupted turn is its latest.
OPEN_EVERY = 1_000
#: Every FAILED_EVERY-th resumed turn failed.
FAILED_EVERY = 50


def _populate(connection: psycopg.Connection[Any], open_every: int = OPEN_EVERY) -> None:
    """SESSIONS sessions, one turn a second apart, each paused at an approval and (but every
    ``open_every``-th) resumed by a second turn; a few of those failed."""
    statements = [
        """INSERT INTO sessions (id, agent, created_at, updated_at)
           SELECT 's' || g, 'bankingAgent', now(), now() FROM generate_series(1, %(n)s) g""",
        """INSERT INTO turns (id, session_id, seq, agent, status, finish_reason, input,
                              history_length, run_after, created_at, updated_at, app_version)
           SELECT 'p' || g, 's' || g, 1, 'bankingAgent', 'completed', 'interrupted',
                  '{"kind": "message"}', 0, now(), now() - (2 * %(n)s - 2 * g) * interval '1s',
                  now(), 'v1'
           FROM generate_series(1, %(n)s) g""",
        """INSERT INTO tool_calls (turn_id, round, ref, name, input, status, idempotency_key,
                                   created_at)
           SELECT 'p' || g, 1, 'approval-1', 'userApproval', '{}', 'interrupted',
                  'p' || g || ':approval-1', now() - (2 * %(n)s - 2 * g) * interval '1s'
           FROM generate_series(1, %(n)s) g""",
        """INSERT INTO turns (id, session_id, seq, agent, parent_id, status, finish_reason,
                              input, history_length, run_after, created_at, updated_at,
                              app_version)
           SELECT 'r' || g, 's' || g, 2, 'bankingAgent', 'p' || g,
                  CASE WHEN g %% %(failed)s = 0 THEN 'failed'::turn_status
                       ELSE 'completed'::turn_status END,
                  CASE WHEN g %% %(failed)s = 0 THEN NULL ELSE 'stop' END,
                  '{"kind": "resume"}', 1, now(),
                  now() - (2 * %(n)s - 2 * g - 1) * interval '1s', now(), 'v1'
           FROM generate_series(1, %(n)s) g WHERE g %% %(open)s <> 0""",
    ]
    values = {"n": SESSIONS, "open": open_every, "failed": FAILED_EVERY}
    for statement in statements:
        connection.execute(statement, values)
    connection.execute("VACUUM ANALYZE")


@pytest.fixture(scope="module")
def history() -> Iterator[str]:
    """A PostgreSQL database holding :func:`_populate`'s history."""
    with postgres_url() as url:
        with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
            _populate(connection)
        yield url


def _statements(url: str, read: Callable[[Connection], Any]) -> list[tuple[str, Any]]:
    """The statements ``read`` sends, with their parameters, on a real connection."""
    sent: list[tuple[str, Any]] = []

    def record(*arguments: Any) -> None:
        _, _, statement, parameters, _, _ = arguments
        sent.append((statement, parameters))

    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            sa.event.listen(connection, "before_cursor_execute", record)
            read(connection)
    finally:
        engine.dispose()
    return sent


def _analyzed(url: str, statement: str, parameters: Any) -> list[dict[str, Any]]:
    """The nodes of ``EXPLAIN (ANALYZE, FORMAT JSON)`` of ``statement``, top-down."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            [(plan,)] = connection.exec_driver_sql(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
            )
    finally:
        engine.dispose()
    nodes: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    return nodes


def _explained(url: str, statement: str, parameters: Any) -> list[dict[str, Any]]:
    """The nodes of ``EXPLAIN (FORMAT JSON)`` of ``statement`` (planned, not run), top-down."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            [(plan,)] = connection.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters)
    finally:
        engine.dispose()
    nodes: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node)
        for child in node.get("Plans", []):
            walk(child)

    walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    return nodes


def _rows_visited(nodes: list[dict[str, Any]], table: str) -> int:
    """The rows of ``table`` the plan's scans read, kept or filtered out, over all loops."""
    return sum(
        (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
        for node in nodes
        if node.get("Relation Name") == table
    )


def _seq_scans(nodes: list[dict[str, Any]]) -> set[str]:
    return {n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"}


def _listing_plan(url: str, query: TurnQuery) -> list[dict[str, Any]]:
    """The analysed plan of the page ``turns ls`` reads for ``query`` (its first statement:
    the second reads the page's waiting approvals)."""
    sent = _statements(url, lambda connection: operation_sql.list_turns(connection, query))
    statement, parameters = sent[0]
    assert "ORDER BY turns.created_at DESC" in statement, statement
    return _analyzed(url, statement, parameters)


LISTINGS = {
    "first page": TurnQuery(),
    "failed": TurnQuery(statuses=("failed",)),
    "agent since": TurnQuery(
        agent="bankingAgent", since=datetime.now(UTC) - timedelta(seconds=SESSIONS)
    ),
    "paused": TurnQuery(statuses=(PAUSED,)),
    "paused or failed": TurnQuery(statuses=(PAUSED, "failed")),
}


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_a_page_of_turns_reads_a_page_of_turns(history: str, name: str) -> None:
    """Each listing's page of 50 visits at most a few thousand of the 39,980 turns (the
    failed ones are one in fifty), through an index, without a sequential scan."""
    nodes = _listing_plan(history, LISTINGS[name])
    detail = json.dumps(nodes[0], indent=1)
    assert "turns" not in _seq_scans(nodes), detail
    assert _rows_visited(nodes, "turns") <= 3_000, detail


#: A requester who owns a few of the history's sessions, and the agents a server serves.
REQUESTER = "ann"
REQUESTER_EVERY = 997
SERVED = ("bankingAgent", "clerkAgent")
RUNS_PAGES = {
    "a requester's first page": TurnQuery(owner=REQUESTER, agents=SERVED),
    "a requester's failed turns": TurnQuery(owner=REQUESTER, statuses=("failed",)),
    "an id prefix": TurnQuery(id_prefix="r1234", agents=SERVED),
    "an id prefix matching nothing": TurnQuery(id_prefix="zz", agents=SERVED),
    "a later page": TurnQuery(
        agents=SERVED, before=(datetime.now(UTC) - timedelta(seconds=SESSIONS), "r10000")
    ),
    "a version's later page": TurnQuery(
        app_version="v1", before=(datetime.now(UTC) - timedelta(seconds=SESSIONS), "r10000")
    ),
}


@pytest.fixture(scope="module")
def owned_history(history: str) -> str:
    """The history with every REQUESTER_EVERY-th session owned by REQUESTER (20 of 20,000)."""
    with psycopg.connect(libpq_dsn(history), autocommit=True) as connection:
        connection.execute(
            "UPDATE sessions SET owner = %s WHERE substr(id, 2)::int %% %s = 0",
            (REQUESTER, REQUESTER_EVERY),
        )
        connection.execute("ANALYZE sessions")
    return history


@pytest.mark.parametrize("name", sorted(RUNS_PAGES))
def test_a_page_of_runs_reads_a_page_of_turns(owned_history: str, name: str) -> None:
    """The runs page's reads (a requester's own turns, an id prefix, a page after a cursor)
    visit at most a few hundred of the 39,980 turns, through indexes, without a sequential
    scan of turns or sessions."""
    nodes = _listing_plan(owned_history, RUNS_PAGES[name])
    detail = json.dumps(nodes[0], indent=1)
    assert not _seq_scans(nodes) & {"turns", "sessions"}, detail
    assert _rows_visited(nodes, "turns") <= 300, detail
    assert _rows_visited(nodes, "sessions") <= 300, detail


def test_a_requesters_runs_are_hers_newest_first(owned_history: str) -> None:
    """The requester's read lists exactly the turns of her sessions, newest first."""
    engine = sa.create_engine(owned_history, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            rows = operation_sql.list_turns(connection, TurnQuery(owner=REQUESTER, limit=100))
    finally:
        engine.dispose()
    sessions = range(REQUESTER_EVERY * (SESSIONS // REQUESTER_EVERY), 0, -REQUESTER_EVERY)
    expected = [
        turn for g in sessions for turn in ((f"r{g}", f"p{g}") if g % OPEN_EVERY else (f"p{g}",))
    ]
    assert [row.id for row in rows] == expected
    assert {row.owner for row in rows} == {REQUESTER}


def test_the_listing_reads_the_created_at_index_backwards(history: str) -> None:
    """The first page is a backward walk of ix_turns_created_at: no sort of turns."""
    nodes = _listing_plan(history, TurnQuery())
    walks = [
        (n["Node Type"], n.get("Scan Direction"))
        for n in nodes
        if n.get("Index Name") == "ix_turns_created_at"
    ]
    assert walks == [("Index Scan", "Backward")], json.dumps(nodes[0], indent=1)
    assert not any(n["Node Type"] in ("Sort", "Incremental Sort") for n in nodes)


def test_listing_paused_turns_finds_the_open_ones(history: str) -> None:
    """The paused filter finds exactly the sessions still waiting, newest first."""
    engine = sa.create_engine(history, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            rows = operation_sql.list_turns(connection, TurnQuery(statuses=(PAUSED,), limit=100))
    finally:
        engine.dispose()
    expected = [f"p{g}" for g in range(SESSIONS, 0, -OPEN_EVERY)]
    assert [row.id for row in rows] == expected
    assert all(len(row.waiting) == 1 for row in rows)


#: In the paused history, every PAUSED_EVERY-th session is paused now (2,000 of 20,000), and
#: every TWICE_EVERY-th session's paused turn asks for a second approval.
PAUSED_EVERY = 10
TWICE_EVERY = 40


@pytest.fixture(scope="module")
def paused_history() -> Iterator[str]:
    """A PostgreSQL database holding :func:`_populate`'s history with 2,000 turns paused now,
    one in four of them at two approvals (two entries in ``approval_queue``)."""
    with postgres_url() as url:
        with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
            _populate(connection, open_every=PAUSED_EVERY)
            connection.execute(
                """INSERT INTO tool_calls (turn_id, round, ref, name, input, status,
                                           idempotency_key, created_at)
                   SELECT id, 1, 'approval-2', 'userApproval', '{}', 'interrupted',
                          id || ':approval-2', now()
                   FROM turns WHERE id LIKE 'p%%' AND substr(id, 2)::int %% %s = 0""",
                (TWICE_EVERY,),
            )
            connection.execute("VACUUM ANALYZE")
        yield url


PAUSED_PAGES = {
    "first page": TurnQuery(statuses=(PAUSED,)),
    "an agent's since": TurnQuery(
        statuses=(PAUSED,),
        agent="bankingAgent",
        since=datetime.now(UTC) - timedelta(seconds=SESSIONS),
    ),
    "a later page": TurnQuery(
        statuses=(PAUSED,), before=(datetime.now(UTC) - timedelta(seconds=SESSIONS), "p10000")
    ),
    "a version's": TurnQuery(statuses=(PAUSED,), app_version="v1"),
    "paused or failed": TurnQuery(statuses=(PAUSED, "failed")),
}


@pytest.mark.parametrize("name", sorted(PAUSED_PAGES))
def test_a_page_of_paused_turns_reads_its_entries_of_the_queue(
    paused_history: str, name: str
) -> None:
    """A page of 50 paused turns, out of 2,000 paused now among 38,000 turns, is a backward
    walk of ix_approval_queue_turn_created_at that stops after its 50 turns' entries (63 with
    the second approvals), each turn read by key: never a walk of the turns ever paused."""
    nodes = _listing_plan(paused_history, PAUSED_PAGES[name])
    detail = json.dumps(nodes[0], indent=1)
    walks = [
        (n["Node Type"], n.get("Scan Direction"))
        for n in nodes
        if n.get("Index Name") == "ix_approval_queue_turn_created_at"
    ]
    assert walks in (
        [("Index Scan", "Backward")],
        [("Index Only Scan", "Backward")],
    ), detail
    assert not _seq_scans(nodes), detail
    assert _rows_visited(nodes, "approval_queue") <= 100, detail
    assert _rows_visited(nodes, "turns") <= 150, detail


def test_paused_pages_list_each_paused_turn_once_newest_first(paused_history: str) -> None:
    """Pages of 300 after the keyset cursor list the 2,000 paused turns once each, newest
    first, a turn at two approvals with both of them, and no resumed turn."""
    listed: list[str] = []
    waiting: dict[str, int] = {}
    engine = sa.create_engine(paused_history, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            before = None
            while True:
                query = TurnQuery(statuses=(PAUSED,), before=before, limit=300)
                page = operation_sql.list_turns(connection, query)
                listed.extend(row.id for row in page)
                waiting.update((row.id, len(row.waiting)) for row in page)
                if len(page) < 300:
                    break
                before = page[-1].key
    finally:
        engine.dispose()
    paused = range(SESSIONS, 0, -PAUSED_EVERY)
    assert listed == [f"p{g}" for g in paused]
    assert waiting == {f"p{g}": 1 + (g % TWICE_EVERY == 0) for g in paused}


def test_the_stats_count_paused_turns_by_version_from_the_open_ones(history: str) -> None:
    """stats' claimable and paused counts per version read no turn at all here (the 20
    paused ones are counted in the queue, which carries each turn's version; none is
    pending), not the 20,000 ever paused, and count exactly those."""
    now = datetime.now(UTC)
    sent = _statements(history, lambda connection: operation_sql.read_stats(connection, now))
    [(statement, parameters)] = [(s, p) for s, p in sent if "app_version" in s]
    nodes = _analyzed(history, statement, parameters)
    detail = json.dumps(nodes[0], indent=1)
    assert "turns" not in _seq_scans(nodes), detail
    assert _rows_visited(nodes, "turns") == 0, detail

    engine = sa.create_engine(history, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            stats = operation_sql.read_stats(connection, now)
    finally:
        engine.dispose()
    assert [(v.agent, v.version, v.claimable, v.paused) for v in stats.versions] == [
        ("bankingAgent", "v1", 0, SESSIONS // OPEN_EVERY)
    ]
    assert stats.paused == SESSIONS // OPEN_EVERY


def test_the_stats_never_read_the_settled_history(history: str) -> None:
    """Every statement of a default stats read visits at most the open turns (20 paused, none
    pending) of the 39,980, without a sequential scan of turns: the settled statuses come
    from the table's statistics, labelled estimates, within a few percent of their counts."""
    now = datetime.now(UTC)
    sent = _statements(history, lambda connection: operation_sql.read_stats(connection, now))
    assert len(sent) >= 5, sent
    for statement, parameters in sent:
        nodes = _analyzed(history, statement, parameters)
        detail = f"{statement}\n{json.dumps(nodes[0], indent=1)}"
        assert "turns" not in _seq_scans(nodes), detail
        assert _rows_visited(nodes, "turns") <= 100, detail

    engine = sa.create_engine(history, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            stats = operation_sql.read_stats(connection, now)
            exact = operation_sql.read_stats(connection, now, exact=True)
    finally:
        engine.dispose()
    assert stats.estimated == ["completed", "failed", "aborted"]
    assert exact.estimated == []
    # Every OPEN_EVERY-th session has no resumed turn: OPEN_EVERY is a multiple of FAILED_EVERY.
    failed = SESSIONS // FAILED_EVERY - SESSIONS // OPEN_EVERY
    assert exact.turns == {
        "pending": 0,
        "aborting": 0,
        "completed": 2 * SESSIONS - SESSIONS // OPEN_EVERY - failed,
        "failed": failed,
        "aborted": 0,
    }
    for status, count in exact.turns.items():
        assert abs(stats.turns[status] - count) <= 0.1 * count + 2, (status, stats.turns)


def test_turns_migrate_finds_a_versions_waiting_turns_among_the_open_ones(history: str) -> None:
    """``turns migrate``'s read of a version's waiting turns visits the 20 paused turns, not
    the 20,000 ever paused, and lists exactly those, oldest first."""
    now = datetime.now(UTC)

    def read(connection: Connection) -> Any:
        return version_sql.list_waiting(
            connection, version="v1", agents=None, now=now, limit=10_000
        )

    [(statement, parameters)] = _statements(history, read)
    nodes = _analyzed(history, statement, parameters)
    detail = json.dumps(nodes[0], indent=1)
    assert "turns" not in _seq_scans(nodes), detail
    assert _rows_visited(nodes, "turns") <= 100, detail

    engine = sa.create_engine(history, poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            waiting = read(connection)
    finally:
        engine.dispose()
    assert [turn.id for turn in waiting] == [
        f"p{g}" for g in range(OPEN_EVERY, SESSIONS + 1, OPEN_EVERY)
    ]


def test_a_metrics_scrape_reads_the_open_approvals_from_their_index() -> None:
    """With 20,000 approvals in the queue (each showing its approver a few hundred bytes), a
    fifth of them decided, the scrape's count of the open ones per agent is an index-only
    scan of ix_approval_queue_open, not a read of the queue's rows, and counts exactly the
    undecided ones."""
    with postgres_url() as url:
        with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
            connection.execute(
                """INSERT INTO sessions (id, agent, created_at, updated_at)
                   SELECT 's' || g, 'agent' || g % 3, now(), now()
                   FROM generate_series(1, 20000) g"""
            )
            connection.execute(
                """INSERT INTO turns (id, session_id, seq, agent, status, finish_reason, input,
                                      history_length, run_after, created_at, updated_at)
                   SELECT 'p' || g, 's' || g, 1, 'agent' || g % 3, 'completed', 'interrupted',
                          '{"kind": "message"}', 0, now(), now(), now()
                   FROM generate_series(1, 20000) g"""
            )
            connection.execute(
                """INSERT INTO tool_calls (turn_id, round, ref, name, input, status,
                                           idempotency_key, created_at)
                   SELECT 'p' || g, 1, 'approval-1', 'userApproval',
                          jsonb_build_object('amount', g, 'memo', repeat('x', 400)),
                          'interrupted',
                          'p' || g || ':approval-1', now() - g * interval '1s'
                   FROM generate_series(1, 20000) g"""
            )
            connection.execute(
                "UPDATE approval_queue SET decided_at = now() WHERE turn_id LIKE '%0'"
                " OR turn_id LIKE '%5'"
            )
            connection.execute("VACUUM ANALYZE")
        sent: list[tuple[str, Any]] = []
        database = MonitoringDatabase(url)
        try:

            def record(*arguments: Any) -> None:
                _, _, statement, parameters, _, _ = arguments
                sent.append((statement, parameters))

            sa.event.listen(database.engine, "before_cursor_execute", record)
            gauges = database.read_gauges(datetime.now(UTC))
        finally:
            database.dispose()
        [(statement, parameters)] = [(s, p) for s, p in sent if "approval_queue" in s]
        nodes = _analyzed(url, statement, parameters)

    detail = json.dumps(nodes[0], indent=1)
    scans = [(n["Node Type"], n.get("Index Name")) for n in nodes if "Relation Name" in n]
    assert scans == [("Index Only Scan", "ix_approval_queue_open")], detail
    assert {agent: g.open_approvals for agent, g in gauges.agents.items()} == {
        "agent0": 5333,
        "agent1": 5334,
        "agent2": 5333,
    }


#: Sessions a retention batch deletes in the plan test: a sliver of the history.
BATCH = 50


def test_a_retention_batch_reads_and_deletes_through_indexes() -> None:
    """A batch of 50 sessions out of 20,000 (a batch is a sliver of a long history) chooses
    its sessions by walking ix_turns_created_at from the oldest turn, looking at each one's
    turns by key, and deletes their turns, messages, journal rows and events by key: no
    statement scans a whole table, and the choice reads about a batch's worth of rows."""
    with postgres_url() as url:
        with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
            _populate(connection)
            connection.execute(
                """UPDATE sessions
                   SET updated_at = now() - (%(n)s - substr(id, 2)::int) * interval '2s'""",
                {"n": SESSIONS},
            )
            connection.execute(
                """INSERT INTO messages (turn_id, round, position, role, content, committed,
                                         created_at)
                   SELECT id, 0, p, 'user', '[]', true, now()
                   FROM turns, generate_series(0, 3) p"""
            )
            connection.execute(
                """INSERT INTO turn_events (turn_id, from_status, to_status, attempt, at)
                   SELECT id, NULL::turn_status, 'pending'::turn_status, 0, now() FROM turns
                   UNION ALL SELECT id, 'pending'::turn_status, status, 1, now() FROM turns"""
            )
            connection.execute("VACUUM ANALYZE")
        later = datetime.now(UTC) + timedelta(hours=1)

        def prune(connection: Connection) -> Any:
            with connection.begin():
                return retention_sql.prune_sessions(connection, settled_before=later, limit=BATCH)

        sent = _statements(url, prune)
        choices = {
            statement: _analyzed(url, statement, parameters)
            for statement, parameters in sent
            if statement.lstrip().startswith("SELECT")
        }
        plans = {
            statement: _explained(url, statement, parameters)
            for statement, parameters in sent
            if statement.lstrip().startswith(("DELETE", "UPDATE"))
        }
    # Costed as a walk of the whole index, the choice would be JIT-compiled for longer
    # than it runs.
    assert ("SET LOCAL jit = off", None) in [(s, p or None) for s, p in sent[:1]], sent[:1]
    assert len(choices) == 3, list(choices)
    [sessions_chosen] = [s for s in choices if "ORDER BY turns.created_at" in s]
    for statement, nodes in choices.items():
        detail = f"{statement}\n{json.dumps(nodes[0], indent=1)}"
        assert _seq_scans(nodes) == set(), detail
        assert _rows_visited(nodes, "sessions") <= 2 * BATCH, detail
        assert _rows_visited(nodes, "turns") <= 10 * BATCH, detail
    scans = {n.get("Index Name") for n in choices[sessions_chosen] if "Relation Name" in n}
    assert "ix_turns_created_at" in scans, scans
    assert len(plans) == 6, list(plans)
    for statement, nodes in plans.items():
        assert _seq_scans(nodes) == set(), f"{statement}\n{json.dumps(nodes[0], indent=1)}"


#: Each operator read by an id prefix, with the primary key it should read by range.
PREFIX_READS: dict[str, tuple[Callable[[Connection], Any], str]] = {
    "turns show <prefix>": (
        lambda connection: operation_sql.ids_starting(connection, "turn", "r1234", 10),
        "pk_turns",
    ),
    "the short ids of a page": (
        lambda connection: operation_sql.id_prefixes(
            connection, "turn", [f"r{g}" for g in range(10_000, 10_050)], 4
        ),
        "pk_turns",
    ),
    "approvals decide <prefix>": (
        lambda connection: operation_sql.approval_keys_starting(connection, "p1234", None, 10),
        "pk_tool_calls",
    ),
    "turns ls --session <prefix>": (
        lambda connection: operation_sql.ids_starting(connection, "session", "s1234", 10),
        "pk_sessions",
    ),
}


@pytest.mark.parametrize("name", sorted(PREFIX_READS))
def test_an_id_prefix_reads_a_range_of_the_primary_key(history: str, name: str) -> None:
    """A prefix read visits the few ids starting so, through the primary key (turn and
    session ids are collated "C", so it holds them in byte order), never every id of the
    table."""
    read, index = PREFIX_READS[name]
    [(statement, parameters)] = _statements(history, read)
    nodes = _analyzed(history, statement, parameters)
    detail = json.dumps(nodes[0], indent=1)
    assert _seq_scans(nodes) == set(), detail
    assert index in {n.get("Index Name") for n in nodes}, detail
    visited = sum(_rows_visited(nodes, table) for table in ("turns", "tool_calls", "sessions"))
    assert visited <= 300, detail


def _parent_reads(url: str, read: Callable[[Connection], Any]) -> list[dict[str, Any]]:
    """The plan nodes reading ``turns`` by ``parent_id`` in the statements ``read`` sends."""
    nodes = [
        node
        for statement, parameters in _statements(url, read)
        if "parent_id =" in statement
        for node in _analyzed(url, statement, parameters)
    ]
    return [n for n in nodes if "parent_id" in n.get("Index Cond", "")]


def test_a_turns_children_are_found_through_the_parent_index(history: str) -> None:
    """`turns show`'s children and the decided approvals' resumes read ix_turns_parent_id,
    which holds only turns with a parent (migration 0025): the equality proves its
    condition."""
    children = _parent_reads(history, lambda c: operation_sql.turn_detail(c, "p5"))
    resumes = _parent_reads(
        history, lambda c: approval_sql.list_decisions(c, DecisionQuery(limit=5))
    )

    for reads in (children, resumes):
        assert reads, "no read of turns by parent_id"
        assert {n["Index Name"] for n in reads} == {"ix_turns_parent_id"}, reads
