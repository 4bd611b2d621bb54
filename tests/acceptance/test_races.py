"""Races between real processes on one PostgreSQL database: what each side is told, and that
nothing accepted is lost."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest

from engine.conversation.parts import Message
from examples.banking import build
from stores import SqlSessionStore
from tests.acceptance.durable_support import REPO_ROOT
from tests.databases import libpq_dsn, postgres_url

#: Senders of each intent in the many-sender race, and the messages each sends.
SENDERS_EACH = 10
MESSAGES_EACH = 2


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh PostgreSQL database."""
    with postgres_url() as url:
        yield url


def run_together(commands: Sequence[Sequence[str]]) -> list[Any]:
    """Start one process per command, let them all go at once once each said ``ready``, and
    return the JSON object each printed last."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", *command],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outputs = [process.communicate(timeout=240)[0] for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert all(process.returncode == 0 for process in processes), outputs
    return [json.loads(output.strip().splitlines()[-1]) for output in outputs]


def user_texts(messages: list[Message]) -> list[str]:
    """The texts of the user messages, in conversation order."""
    return ["".join(p.text or "" for p in m.content) for m in messages if m.role == "user"]


def chain_of(database: str, session_id: str) -> list[tuple[str, str | None]]:
    """The session's turns, ``(id, parent_id)`` in the order they joined it."""
    with psycopg.connect(libpq_dsn(database)) as connection:
        rows = connection.execute(
            "SELECT id, parent_id FROM turns WHERE session_id = %s ORDER BY seq",
            (session_id,),
        ).fetchall()
    return [(turn, parent) for turn, parent in rows]


@pytest.mark.timeout(300)
async def test_twenty_processes_sending_to_one_session_keep_every_accepted_message(
    database: str,
) -> None:
    """Twenty processes send to one session at once, half naming the session, half from a
    chat that follows its own turns (snapshot and session): each send is accepted or refused
    with a typed conflict, and the conversation holds every accepted message once, each
    sender's in its order, in one chain of turns (no fork, no branch)."""
    store = SqlSessionStore(database)
    agent = build(store=store, execution="inline").banking_agent
    first = await agent.chat().send("first")
    session = first.session_id
    commands = [
        [
            "tests.acceptance.race_sender",
            database,
            session,
            f"{intent}{n}",
            str(MESSAGES_EACH),
            intent,
        ]
        for intent in ("session", "chat")
        for n in range(SENDERS_EACH)
    ]
    results = await asyncio.to_thread(run_together, commands)
    accepted = [result["accepted"] for result in results]

    assert all(len(sent) == MESSAGES_EACH for sent in accepted)
    refusals = {kind for result in results for kind in result["refusals"]}
    assert refusals <= {"StaleSnapshotError", "SessionBusyError"}, refusals
    latest = await agent.get_snapshot(session_id=session)
    assert latest is not None
    texts = user_texts(latest.state.messages)
    assert sorted(texts) == sorted(["first", *(t for sent in accepted for t in sent)])
    for sent in accepted:
        assert sent == [n for n in texts if n in sent], "a sender's messages out of order"
    chain = chain_of(database, session)
    assert [parent for _, parent in chain] == [None, *(turn for turn, _ in chain[:-1])]
    with psycopg.connect(libpq_dsn(database)) as connection:
        (sessions,) = connection.execute("SELECT count(*) FROM sessions").fetchone() or (0,)
    assert sessions == 1, "a send opened another session"
    await store.close()


async def _two_continue(database: str, intent: str) -> tuple[Any, list[Any]]:
    """Two processes continue one settled snapshot at once with the intent ``intent``;
    returns the snapshot's response and what each process got."""
    store = SqlSessionStore(database)
    agent = build(store=store, execution="inline").banking_agent
    root = await agent.chat().send("root")
    await store.close()
    commands = [
        [
            "tests.acceptance.intent_sender",
            database,
            intent,
            root.session_id,
            str(root.snapshot_id),
            text,
        ]
        for text in ("left", "right")
    ]
    return root, await asyncio.to_thread(run_together, commands)


async def _conversation(database: str, snapshot_id: str) -> list[str]:
    store = SqlSessionStore(database)
    agent = build(store=store, execution="inline").banking_agent
    snapshot = await agent.get_snapshot(snapshot_id=snapshot_id)
    await store.close()
    assert snapshot is not None
    return user_texts(snapshot.state.messages)


@pytest.mark.timeout(120)
async def test_two_processes_continuing_from_where_they_are_one_wins(database: str) -> None:
    """Two chats at the same snapshot send at once (snapshot and session): one is accepted,
    the other is refused with a typed conflict, and nothing of its message is written."""
    root, results = await _two_continue(database, "chat")

    won = [r for r in results if "snapshot_id" in r]
    lost = [r for r in results if "refused" in r]
    assert len(won) == 1 and len(lost) == 1, results
    assert lost[0]["refused"] in ("StaleSnapshotError", "SessionBusyError")
    assert lost[0]["status"] == "ABORTED"
    assert won[0]["session_id"] == root.session_id
    assert len(chain_of(database, root.session_id)) == 2
    texts = await _conversation(database, won[0]["snapshot_id"])
    assert texts[0] == "root" and len(texts) == 2


@pytest.mark.timeout(120)
async def test_two_processes_continuing_exactly_one_snapshot_append_and_branch(
    database: str,
) -> None:
    """Two processes continue exactly one snapshot at once (snapshot alone, Genkit's
    meaning): both are accepted, one appended to the session and one branched into a new
    session whose turn has that snapshot as parent; each conversation holds one message."""
    root, results = await _two_continue(database, "snapshot")

    assert all("snapshot_id" in r for r in results), results
    appended = [r for r in results if r["session_id"] == root.session_id]
    branched = [r for r in results if r["session_id"] != root.session_id]
    assert len(appended) == 1 and len(branched) == 1, results
    assert chain_of(database, root.session_id) == [
        (str(root.snapshot_id), None),
        (appended[0]["snapshot_id"], root.snapshot_id),
    ]
    assert chain_of(database, branched[0]["session_id"]) == [
        (branched[0]["snapshot_id"], root.snapshot_id)
    ]
    one = await _conversation(database, appended[0]["snapshot_id"])
    other = await _conversation(database, branched[0]["snapshot_id"])
    assert {one[1], other[1]} == {"left", "right"}
    assert one[0] == other[0] == "root" and len(one) == len(other) == 2


@pytest.mark.timeout(120)
async def test_two_processes_continuing_one_session_both_land_in_order(database: str) -> None:
    """Two processes send by session id at once: one is accepted and the other is told the
    session moved on or is busy (typed, ``ABORTED``) — never forked, never branched."""
    root, results = await _two_continue(database, "session")

    won = [r for r in results if "snapshot_id" in r]
    lost = [r for r in results if "refused" in r]
    assert len(won) + len(lost) == 2 and won, results
    for refusal in lost:
        assert refusal["refused"] in ("StaleSnapshotError", "SessionBusyError")
        assert refusal["status"] == "ABORTED"
    chain = chain_of(database, root.session_id)
    assert len(chain) == 1 + len(won)
    assert [parent for _, parent in chain] == [None, *(turn for turn, _ in chain[:-1])]
    assert all(r["session_id"] == root.session_id for r in won)
