"""The operator's tables in a real terminal, and ids given by their first characters.

``turnstile turns ls``, ``approvals ls``, and the tables of ``turns show`` and ``turns
retry``, run as ``python -m workers.cli`` processes on a pseudo-terminal 80 columns wide,
against a database holding the banking example's turns (paused at approvals, failed,
completed), created through its agent. What a person sees must fit the terminal, show what
each approval asks with its amount, and print each id whole, ready to paste into the next
command; ``--wide`` shows every column. Every command taking an id (a turn's, an
approval's, a browser session's) takes a unique prefix of it; deciding an approval through
the example's app, whose signing key is published, takes ``--dev``
(issue 33).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from engine.conversation.parts import Message
from engine.remote.ui.browser_sessions import BrowserSessionRecord
from engine.store import TurnInput
from engine.turns.request import TurnRequest
from examples.banking import build
from stores.sql import SqlSessionStore
from stores.ui_sessions import SqlBrowserSessions
from tests.databases import (
    drop_postgres_database,
    libpq_dsn,
    new_postgres_database,
    new_sqlite_database,
)

#: Each test runs a dozen ``turnstile`` processes.
pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
APP = "examples.banking:ai"
#: Two paused turns whose ids share their first eight characters, on purpose.
CAROL = "748c8e91-aaaa-4354-a87e-95a79474ad7c"
BOB = "748c8e91-bbbb-4c62-a8e8-77ec4d5e636e"
ALICE = "29a81c31-7943-4025-8a49-a9b69946a7ec"
FAILED = "c0ffee00-0000-4000-8000-000000000001"
DONE = "d0d0d0d0-0000-4000-8000-000000000002"
SEEDS = [
    (CAROL, "transfer $40 to carol"),
    (BOB, "transfer $250 to bob"),
    (ALICE, "transfer $1234567 to alice"),
    (FAILED, "please fail"),
    (DONE, "hello"),
]
PAUSED = {CAROL: "$40", BOB: "$250", ALICE: "$1234567"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Ran:
    """A finished ``turnstile`` command."""

    status: int
    out: str
    err: str

    def json(self) -> object:
        """Standard output parsed as JSON."""
        return json.loads(self.out)


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    env.update(PYTHONPATH=str(ROOT), TURNSTILE_DATABASE_URL=url, TERM="xterm-256color")
    return env


def in_terminal(url: str, *args: str, columns: int = 80) -> list[str]:
    """The lines ``turnstile <args>`` prints on a terminal ``columns`` wide (no ``COLUMNS``:
    the width is the terminal's own), colours stripped."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=ROOT,
        env=_env(url),
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError as exc:  # the terminal closes when the command exits
            if exc.errno != errno.EIO:
                raise
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=60) == 0
    text = ANSI.sub("", b"".join(chunks).decode())
    return [line for line in text.replace("\r\n", "\n").split("\n") if line.strip()]


def run(url: str, *args: str) -> Ran:
    """``turnstile <args>`` with its output captured (no terminal)."""
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=ROOT,
        env=_env(url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


async def _seed(url: str) -> None:
    """The banking example's turns, run in this process: three paused at approvals, one
    failed, one completed."""
    store = SqlSessionStore(url)
    agent = build(store=store, execution="inline").banking_agent
    try:
        for turn_id, text in SEEDS:
            request = TurnRequest(
                input=TurnInput(kind="message", message=Message.user(text)), turn_id=turn_id
            )
            try:
                await agent.submit(request)
            except Exception as exc:  # the scripted model's failure, recorded on the turn
                assert "Scripted model failure" in str(exc)
    finally:
        await store.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def banking_db(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A migrated database with the banking example's turns; its URL."""
    url = new_postgres_database() if request.param == "postgres" else new_sqlite_database()
    try:
        await _seed(url)
        yield url
    finally:
        if request.param == "postgres":
            drop_postgres_database(url)


@pytest.fixture
async def sqlite_banking_db() -> str:
    """The same turns on SQLite, the embedded default a first user meets."""
    url = new_sqlite_database()
    await _seed(url)
    return url


def _table(lines: list[str], title: str) -> list[str]:
    """The title, header and first row of the table titled ``title``."""
    start = next(n for n, line in enumerate(lines) if line.strip() == title)
    return lines[start : start + 3]


def _rows(lines: list[str]) -> Iterator[tuple[str, str]]:
    """Each row's first cell (its id) and the row's line, for lines starting a row."""
    for line in lines[1:]:
        if not line.startswith(" "):
            yield line.split()[0], line


async def test_approvals_ls_fits_80_columns_and_each_id_pastes(sqlite_banking_db: str) -> None:
    """At 80 columns every line fits, each approval's id is whole and names it in
    ``approvals show``, and what it asks is there with its amount."""
    url = sqlite_banking_db
    lines = in_terminal(url, "approvals", "ls")
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].split()[:2] == ["ID", "ASKED"]
    text = "\n".join(lines)
    for amount in PAUSED.values():
        assert amount in text
    assert "userApproval: Transfer $40 to carol" in text
    shown = {}
    for pasted, _line in _rows(lines):
        done = run(url, "approvals", "show", pasted, "--json")
        assert done.status == 0, done.err
        shown[pasted] = done.json()["approval"]["id"]  # type: ignore[index]
    assert sorted(shown.values()) == sorted(f"{t}:approval-1" for t in PAUSED)
    # The two turns sharing eight characters print one more each; the others eight.
    assert set(shown) == {"748c8e91-a:approval-1", "748c8e91-b:approval-1", "29a81c31:approval-1"}


async def test_turns_ls_fits_80_columns_and_each_id_pastes(sqlite_banking_db: str) -> None:
    """At 80 columns every line of ``turns ls`` fits, each turn's id is whole and names it
    in ``turns show``, and a paused turn says what its approval asks; so do the tool calls
    of ``turns show`` (what each call asks first; the columns empty in every call left out)
    and the turns ``turns retry`` retried (how each ended; both ids pasteable)."""
    url = sqlite_banking_db
    lines = in_terminal(url, "turns", "ls")
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert "INTERNAL: Scripted model" in text and "hello" in text
    for amount in PAUSED.values():
        assert amount in text
    resolved = set()
    for pasted, _line in _rows(lines):
        done = run(url, "turns", "show", pasted, "--json")
        assert done.status == 0, done.err
        resolved.add(done.json()["turn"]["id"])  # type: ignore[index]
    assert resolved == {turn_id for turn_id, _ in SEEDS}
    # The tables of `turns show` and `turns retry` keep to the same rules.
    shown = in_terminal(url, "turns", "show", ALICE[:8])
    assert all(len(line) <= 80 for line in shown), shown
    calls = _table(shown, "Tool calls")
    assert calls[1].split() == ["ROUND", "REF", "CALL", "STATE"], calls
    assert calls[2].split()[:3] == ["1", "approval-1", "userApproval:"], calls
    assert "Transfer $1234567 to alice" in "\n".join(calls)
    retried = in_terminal(url, "turns", "retry", FAILED[:8], "--app", APP)
    table = _table(retried, "Retried")
    assert all(len(line) <= 80 for line in table), table
    assert table[1].split() == ["TURN", "RETRY", "TURN", "ENDED", "AGENT"], table
    turn, retry_turn, *ended = table[2].split()
    assert " ".join(ended) == "INTERNAL: Scripted model failure bankingAgent"
    for pasted, kind in ((turn, "message"), (retry_turn, "retry")):
        found = run(url, "turns", "show", pasted, "--json")
        assert found.status == 0, found.err
        assert found.json()["turn"]["input"]["kind"] == kind  # type: ignore[index]


#: Settled turns added to the PostgreSQL database for its statistics: one in ten failed.
HISTORY = 1_000


def _grow_and_analyze(url: str) -> None:
    """HISTORY settled turns more (each its own session's), then ``ANALYZE``: the table now
    has statistics for stats' estimates."""
    with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
        connection.execute(
            """INSERT INTO sessions (id, agent, created_at, updated_at)
               SELECT 'h' || g, 'bankingAgent', now(), now() FROM generate_series(1, %(n)s) g""",
            {"n": HISTORY},
        )
        connection.execute(
            """INSERT INTO turns (id, session_id, seq, agent, status, input, history_length,
                                  run_after, created_at, updated_at)
               SELECT 'h' || g, 'h' || g, 1, 'bankingAgent',
                      CASE WHEN g %% 10 = 0 THEN 'failed'::turn_status
                           ELSE 'completed'::turn_status END,
                      '{"kind": "message"}', 0, now(), now(), now()
               FROM generate_series(1, %(n)s) g""",
            {"n": HISTORY},
        )
        connection.execute("ANALYZE turns")


def _count_cell(lines: list[str], status: str) -> str:
    """The TURNS cell of ``status``'s row in the Turns table."""
    row = next(line for line in lines if line.startswith(f"│ {status} "))
    return row.split("│")[2].strip()


async def test_stats_fits_80_columns_and_marks_its_estimates(banking_db: str) -> None:
    """At 80 columns every line of ``stats`` fits; on PostgreSQL with statistics the settled
    counts are marked ≈ with a line saying what they are, and ``--exact`` prints the counts
    unmarked; SQLite's are exact and unmarked."""
    url = banking_db
    postgres = url.startswith("postgresql")
    if postgres:
        _grow_and_analyze(url)
    lines = in_terminal(url, "stats")
    assert all(len(line) <= 80 for line in lines), lines
    exact_lines = in_terminal(url, "stats", "--exact")
    assert all(len(line) <= 80 for line in exact_lines), exact_lines
    counted = run(url, "stats", "--exact", "--json").json()["turns"]  # type: ignore[index]
    for status in ("pending", "aborting", "completed", "failed", "aborted"):
        assert _count_cell(exact_lines, status) == str(counted[status])
        marked = postgres and status in ("completed", "failed", "aborted")
        assert _count_cell(lines, status).startswith("≈ ") == marked, lines
    note = [line for line in lines if "estimated from PostgreSQL's statistics" in line]
    assert len(note) == (1 if postgres else 0), lines
    assert not any("≈" in line for line in exact_lines), exact_lines
    if postgres:
        # The whole history is sampled at this size: the estimates are the counts.
        assert _count_cell(lines, "completed") == f"≈ {counted['completed']}"


async def test_wide_shows_every_column_with_whole_ids(sqlite_banking_db: str) -> None:
    """``--wide`` prints every column, ids and inputs whole, however narrow the terminal;
    the default leaves out the columns empty in every row."""
    url = sqlite_banking_db
    approvals = in_terminal(url, "approvals", "ls", "--wide")
    assert approvals[0].split() == [
        "ID",
        "AGENT",
        "VERSION",
        "INTERRUPT",
        "INPUT",
        "AGE",
        "DEADLINE",
        "ASSIGNEE",
        "GROUP",
        "SESSION",
    ]
    text = "\n".join(approvals)
    for turn_id in PAUSED:
        assert f"{turn_id}:approval-1" in text
    assert '{"action": "transferMoney", "details": "Transfer $1234567 to alice"}' in text
    turns = in_terminal(url, "turns", "ls", "--wide")
    assert turns[0].split() == [
        "ID",
        "AGENT",
        "SESSION",
        "STATUS",
        "FINISH",
        "KIND",
        "ATTEMPTS",
        "AGE",
        "WAITING",
    ]
    assert all(turn_id in "\n".join(turns) for turn_id, _ in SEEDS)
    default = in_terminal(url, "approvals", "ls")
    assert not {"DEADLINE", "ASSIGNEE", "GROUP"} & set(default[0].split())
    calls = _table(in_terminal(url, "turns", "show", ALICE, "--wide"), "Tool calls")
    assert calls[1].split() == [
        "ROUND",
        "REF",
        "NAME",
        "STATE",
        "IDEMPOTENCY",
        "KEY",
        "INPUT",
        "RESULT",
        "DECIDED",
        "BY",
    ]
    assert f"{ALICE}:approval-1" in calls[2]
    assert '{"action": "transferMoney", "details": "Transfer $1234567 to alice"}' in calls[2]


async def test_turn_ids_by_prefix(banking_db: str) -> None:
    """A unique prefix names a turn in every command taking one; a shared one is a usage
    error naming the turns; an unknown one is not found; ``%`` and ``_`` are literal."""
    url = banking_db
    shown = run(url, "turns", "show", "748c8e91-a", "--json")
    assert shown.status == 0, shown.err
    assert shown.json()["turn"]["id"] == CAROL  # type: ignore[index]
    timeline = run(url, "turns", "timeline", ALICE[:8])
    assert timeline.status == 0 and f"Timeline of {ALICE}" in timeline.out
    shared = run(url, "turns", "show", "748c8e91")
    assert shared.status == 2, shared
    assert CAROL in shared.err and BOB in shared.err and "more characters" in shared.err
    for unknown in ("ffffffff", "748c8e91%", "748c8e91_aaaa", "_48c8e91"):
        missing = run(url, "turns", "show", unknown)
        assert missing.status == 1, (unknown, missing)
        assert "no turn" in missing.err
    retry = run(url, "turns", "retry", FAILED[:8], "--dry-run", "--json")
    assert retry.status == 0, retry.err
    assert [r["turn_id"] for r in retry.json()["retried"]] == [FAILED]  # type: ignore[index]
    ambiguous_retry = run(url, "turns", "retry", "748c8e91", "--dry-run")
    assert ambiguous_retry.status == 2 and CAROL in ambiguous_retry.err
    aborted = run(url, "turns", "abort", "748c8e91-b", "--app", APP, "--json")
    assert aborted.status == 1, aborted.err  # paused: nothing to abort, but found
    assert aborted.json()["items"] == [  # type: ignore[index]
        {"turn_id": BOB, "status": "completed", "result": "not_running"}
    ]
    session = shown.json()["turn"]["session_id"]  # type: ignore[index]
    in_session = run(url, "turns", "ls", "--session", session[:12], "--json")
    assert [t["id"] for t in in_session.json()["items"]] == [CAROL]  # type: ignore[index]


async def test_approval_ids_by_prefix(banking_db: str) -> None:
    """An approval is named by its turn id's unique prefix and its ref, or by the turn's
    prefix alone; a shared prefix is a usage error naming them; deciding and claiming by
    prefix report the whole id."""
    url = banking_db
    for given, expected in [
        (f"{ALICE[:8]}:approval-1", ALICE),
        ("748c8e91-b:approval-1", BOB),
        ("748c8e91-a", CAROL),
        (f"{CAROL}:approval-1", CAROL),
    ]:
        shown = run(url, "approvals", "show", given, "--json")
        assert shown.status == 0, (given, shown.err)
        assert shown.json()["approval"]["id"] == f"{expected}:approval-1"  # type: ignore[index]
    shared = run(url, "approvals", "show", "748c8e91:approval-1")
    assert shared.status == 2, shared
    assert f"{CAROL}:approval-1" in shared.err and f"{BOB}:approval-1" in shared.err
    for unknown in ("ffffffff:approval-1", f"{ALICE[:8]}:approval-9", "748c8e91%:approval-1"):
        missing = run(url, "approvals", "show", unknown)
        assert missing.status == 1, (unknown, missing)
        assert "no approval" in missing.err
    claimed = run(url, "approvals", "claim", "748c8e91-b", "--by", "dave", "--app", APP)
    assert claimed.status == 0, claimed.err
    assert claimed.out.startswith(f"{BOB}:approval-1: assigned to dave")
    decide = ("approvals", "approve", f"{ALICE[:8]}:approval-1", "--by", "alice", "--app", APP)
    # The example signs its client-managed agent's state with a published key.
    refused = run(url, *decide)
    assert refused.status == 2 and "--dev" in refused.err, refused
    approved = run(url, *decide, "--dev")
    assert approved.status == 0, approved.err
    assert approved.out.startswith(f"{ALICE}:approval-1: ")
    again = run(url, "approvals", "approve", ALICE[:8], "--by", "bob", "--app", APP, "--dev")
    assert again.status == 1 and f"approval {ALICE}:approval-1 is no longer pending" in again.err


async def test_browser_session_revoked_by_prefix(sqlite_banking_db: str) -> None:
    """``ui sessions revoke`` takes a unique prefix of a browser session's id; a shared one
    is a usage error and revokes nothing."""
    url = sqlite_banking_db
    store = SqlSessionStore(url)
    now = datetime.now(UTC)
    browsers = SqlBrowserSessions(store.db)
    try:
        for session_id in ("5e55-aaaa-first", "5e55-bbbb-second"):
            await browsers.create_browser_session(
                BrowserSessionRecord(
                    id=session_id,
                    principal="bob",
                    roles=(),
                    csrf="csrf-" + session_id,
                    created_at=now,
                    last_seen_at=now,
                    expires_at=now + timedelta(hours=1),
                )
            )
    finally:
        await store.close()
    shared = run(url, "ui", "sessions", "revoke", "5e55")
    assert shared.status == 2 and "5e55-aaaa-first" in shared.err, shared
    revoked = run(url, "ui", "sessions", "revoke", "5e55-b", "--json")
    assert revoked.status == 0, revoked.err
    assert revoked.json() == {"revoked": ["5e55-bbbb-second"]}
    assert run(url, "ui", "sessions", "revoke", "5e55-c").status == 1
