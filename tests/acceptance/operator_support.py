"""What the operator CLI's acceptance tests share: a database with the app of
:mod:`tests.acceptance.operator_app`, ``turnstile`` commands run as processes on it, and
waits on what the database holds.

Turns are created from the test process through the app's own agent (as a client would);
a ``turnstile worker`` process runs them; every command under test is a real
``python -m workers.cli`` process with its output captured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from engine import Agent, Engine
from stores.operations import TurnQuery, TurnRow
from stores.sql import SqlSessionStore
from tests.acceptance.operator_app import AGENT, make_engine
from tests.databases import drop_postgres_database, new_postgres_database, new_sqlite_database
from tests.http_support import DEPLOYABLE_STATE_KEYS, worker_process

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.operator_app:ai"

T = TypeVar("T")


@dataclass
class Done:
    """A finished ``turnstile`` command."""

    status: int
    out: str
    err: str

    def json(self) -> Any:
        """Standard output parsed as JSON."""
        return json.loads(self.out)


@dataclass
class OperatorDatabase:
    """A fresh database, the app on it in this process, and its files."""

    kind: str
    url: str
    folder: Path
    engine: Engine
    store: SqlSessionStore
    env: dict[str, str] = field(default_factory=dict)

    @property
    def agent(self) -> Agent:
        """The app's agent, ``opsAgent``."""
        return self.engine.agents[AGENT]

    @property
    def outage(self) -> Path:
        """While this file exists, the worker's model fails every call."""
        return self.folder / "outage"

    @property
    def ledger(self) -> Path:
        """The transfers booked, one line per idempotency key."""
        return self.folder / "ledger.jsonl"

    def cli(self, *args: str, app: bool = False, timeout: float = 120) -> Done:
        """Run ``turnstile <args> --db <url>`` (with ``TURNSTILE_APP`` when ``app``)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
        env.update(self.env)
        env["PYTHONPATH"] = str(ROOT)
        env["COLUMNS"] = "250"
        if app:
            env["TURNSTILE_APP"] = APP
        done = subprocess.run(
            [sys.executable, "-m", "workers.cli", *args, "--db", self.url],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Done(done.returncode, done.stdout, done.stderr)

    async def run_cli(self, *args: str, app: bool = False, timeout: float = 120) -> Done:
        """:meth:`cli` in a thread (the test's event loop keeps running)."""
        return await asyncio.to_thread(self.cli, *args, app=app, timeout=timeout)

    @contextlib.contextmanager
    def worker(self, concurrency: int = 4) -> Iterator[subprocess.Popen[bytes]]:
        """A ``turnstile worker`` process on the database, for as long as the block runs."""
        with worker_process(self.url, app=APP, concurrency=concurrency, env=self.env) as process:
            yield process

    async def send(self, text: str) -> str:
        """Queue a new session's turn saying ``text``; its id."""
        response = await self.agent.chat().send(text, wait=False)
        assert response.snapshot_id is not None
        return response.snapshot_id

    async def turns(self, **filters: Any) -> list[TurnRow]:
        """The turns ``filters`` (:class:`TurnQuery` fields) select, newest first."""
        return await self.store.list_turns(TurnQuery(limit=10_000, **filters))

    async def wait_for(
        self, what: str, check: Callable[[], Awaitable[T | None]], timeout: float = 60
    ) -> T:
        """Poll ``check`` until it returns something; fail naming ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            found = await check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.1)

    async def settled(self, count: int, **filters: Any) -> list[TurnRow]:
        """Wait until ``count`` turns match ``filters``; those turns."""

        async def enough() -> list[TurnRow] | None:
            rows = await self.turns(**filters)
            return rows if len(rows) >= count else None

        return await self.wait_for(f"{count} turns with {filters}", enough)


@contextlib.asynccontextmanager
async def operator_database(kind: str, folder: Path) -> AsyncIterator[OperatorDatabase]:
    """A fresh migrated ``postgres`` or ``sqlite`` database with the app on it."""
    url = new_postgres_database() if kind == "postgres" else new_sqlite_database()
    env = {
        "TURNSTILE_STATE_KEYS": DEPLOYABLE_STATE_KEYS,
        "TEST_MODEL_OUTAGE": str(folder / "outage"),
        "TEST_LEDGER": str(folder / "ledger.jsonl"),
    }
    engine = make_engine(url, outage=folder / "outage", ledger=folder / "ledger.jsonl")
    store = SqlSessionStore(url)
    try:
        yield OperatorDatabase(kind, url, folder, engine, store, env)
    finally:
        await store.close()
        agent_store = engine.agents[AGENT].store
        if agent_store is not None:
            await agent_store.close()
        if kind == "postgres":
            drop_postgres_database(url)
