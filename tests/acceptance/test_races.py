"""Races between real processes on one PostgreSQL database: what each side is told, and that
nothing accepted is lost."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from engine.parts import Message
from examples.banking import build
from stores import SqlSessionStore
from tests.acceptance.durable_support import REPO_ROOT
from tests.databases import libpq_dsn, postgres_url

SENDERS = 8
MESSAGES_EACH = 3


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh PostgreSQL database."""
    with postgres_url() as url:
        yield url


def run_senders(database: str, session_id: str) -> list[str]:
    """Start the sender processes, let them all go at once, and return what each printed."""
    senders = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.acceptance.race_sender",
                database,
                session_id,
                f"s{n}",
                str(MESSAGES_EACH),
            ],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(SENDERS)
    ]
    try:
        for sender in senders:
            assert sender.stdout is not None and sender.stdout.readline().strip() == "ready"
        for sender in senders:
            assert sender.stdin is not None
            sender.stdin.write("go\n")
            sender.stdin.flush()
        outputs = [sender.communicate(timeout=150)[0] for sender in senders]
    finally:
        for sender in senders:
            sender.kill()
    assert all(sender.returncode == 0 for sender in senders), outputs
    return outputs


def user_texts(messages: list[Message]) -> list[str]:
    """The texts of the user messages, in conversation order."""
    return ["".join(p.text or "" for p in m.content) for m in messages if m.role == "user"]


@pytest.mark.timeout(180)
async def test_concurrent_sends_to_one_session_keep_every_accepted_message(
    database: str,
) -> None:
    """Processes sending to one session at once: each send is accepted or refused with a
    retryable conflict, and the session's conversation ends up holding every accepted
    message once, each sender's in its order, in one chain of turns (no fork)."""
    store = SqlSessionStore(database)
    agent = build(store=store, execution="inline").banking_agent
    first = await agent.chat().send("first")
    outputs = await asyncio.to_thread(run_senders, database, first.session_id)
    accepted = [json.loads(output.strip().splitlines()[-1]) for output in outputs]

    latest = await agent.get_snapshot(session_id=first.session_id)
    assert latest is not None
    texts = user_texts(latest.state.messages)
    assert sorted(texts) == sorted(["first", *(t for sent in accepted for t in sent)])
    for sent in accepted:
        assert sent == [n for n in texts if n in sent], "a sender's messages out of order"
    with psycopg.connect(libpq_dsn(database)) as connection:
        chain = connection.execute(
            "SELECT id, parent_id FROM turns WHERE session_id = %s ORDER BY seq",
            (first.session_id,),
        ).fetchall()
    assert [parent for _, parent in chain] == [None, *(turn for turn, _ in chain[:-1])]
    await store.close()
