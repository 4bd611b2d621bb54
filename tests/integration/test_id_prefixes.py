"""An operator's id prefix (``turns show ab12``, ``approvals decide ab12``, the short ids of
``turns ls``) matches ids literally and exactly on both databases, and reads the primary key
as a range: no read of every id of the table."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from stores import operations as operation_sql
from stores.schema import sessions, tool_calls, turns
from tests.databases import new_sqlite_database, postgres_url

#: Ids chosen so that case, LIKE's wildcards and a shared head each make a wrong match likely.
IDS = ("ab12-x", "ab12-y", "AB12-z", "ab13", "ab1_", "ab1%q", "zz")


@pytest.fixture(params=["postgres", "sqlite"])
def connection(request: pytest.FixtureRequest) -> Iterator[Connection]:
    """A migrated database holding a turn (with an interrupted call) of each of IDS."""
    with (
        postgres_url() if request.param == "postgres" else nullcontext(new_sqlite_database()) as url
    ):
        engine = sa.create_engine(url, poolclass=sa.NullPool)
        try:
            with engine.begin() as setup:
                _populate(setup)
            with engine.connect() as connection:
                yield connection
        finally:
            engine.dispose()


@pytest.fixture
def sqlite_connection() -> Iterator[Connection]:
    """The same rows in SQLite only, for its query plans."""
    with nullcontext(new_sqlite_database()) as url:
        engine = sa.create_engine(url, poolclass=sa.NullPool)
        try:
            with engine.begin() as setup:
                _populate(setup)
            with engine.connect() as connection:
                yield connection
        finally:
            engine.dispose()


def _populate(connection: Connection) -> None:
    now = datetime.now(UTC)
    for n, turn_id in enumerate(IDS):
        connection.execute(
            sa.insert(sessions).values(id=f"s{n}", agent="a", created_at=now, updated_at=now)
        )
        connection.execute(
            sa.insert(turns).values(
                id=turn_id,
                session_id=f"s{n}",
                seq=1,
                agent="a",
                status="completed",
                finish_reason="interrupted",
                input={"kind": "message"},
                history_length=0,
                run_after=now,
                created_at=now,
                updated_at=now,
            )
        )
        connection.execute(
            sa.insert(tool_calls).values(
                turn_id=turn_id,
                round=1,
                ref="approval-1",
                name="userApproval",
                status="interrupted",
                interrupt={},
                idempotency_key=f"{turn_id}:approval-1",
                created_at=now,
            )
        )


def test_a_prefix_matches_ids_literally_and_with_their_case(connection: Connection) -> None:
    """``ab12`` finds the two ids starting so and not ``AB12-z``; ``ab1_`` and ``ab1%`` find
    only the id holding that character, not every id of that length."""
    assert operation_sql.ids_starting(connection, "turn", "ab12", 10) == ["ab12-x", "ab12-y"]
    assert operation_sql.ids_starting(connection, "turn", "ab1_", 10) == ["ab1_"]
    assert operation_sql.ids_starting(connection, "turn", "ab1%", 10) == ["ab1%q"]
    assert operation_sql.ids_starting(connection, "turn", "ab12-x", 10) == ["ab12-x"]
    assert operation_sql.ids_starting(connection, "session", "s1", 10) == ["s1"]
    assert operation_sql.approval_keys_starting(connection, "ab12", None, 10) == [
        ("ab12-x", "approval-1"),
        ("ab12-y", "approval-1"),
    ]


def test_each_id_gets_its_shortest_unshared_prefix(connection: Connection) -> None:
    """The short ids of a listing: as short as allowed, longer only while another id shares
    the prefix."""
    assert operation_sql.id_prefixes(connection, "turn", ["ab12-x", "ab13", "zz"], 3) == {
        "ab12-x": "ab12-x",
        "ab13": "ab13",
        "zz": "zz",
    }


def test_sqlite_reads_the_primary_keys_by_range(sqlite_connection: Connection) -> None:
    """On SQLite, whose LIKE ignores case and so reads no index, each prefix read (of turns,
    journal rows and sessions) searches the primary key's range instead of scanning."""
    sent: list[tuple[str, object]] = []

    def record(*arguments: object) -> None:
        sent.append((str(arguments[2]), arguments[3]))

    sa.event.listen(sqlite_connection, "before_cursor_execute", record)
    operation_sql.ids_starting(sqlite_connection, "turn", "ab12", 10)
    operation_sql.id_prefixes(sqlite_connection, "turn", ["ab12-x", "ab13"], 3)
    operation_sql.approval_keys_starting(sqlite_connection, "ab12", None, 10)
    operation_sql.ids_starting(sqlite_connection, "session", "s1", 10)
    sa.event.remove(sqlite_connection, "before_cursor_execute", record)
    assert len(sent) == 4
    for statement, parameters in sent:
        plan = sqlite_connection.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {statement}",
            parameters,  # type: ignore[arg-type]
        ).all()
        steps = [str(row[3]) for row in plan]
        assert not [s for s in steps if s.startswith("SCAN")], (statement, steps)
        assert any("_id>? AND" in s or "(id>? AND" in s for s in steps), (statement, steps)
