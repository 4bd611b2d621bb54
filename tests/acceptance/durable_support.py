"""Real worker processes for the durable acceptance tests: start, watch, signal, clean up.

A :class:`Cluster` owns one fresh PostgreSQL database, the worker processes started on it
(``python -m workers.cli worker --app tests.acceptance.durable_app:ai``), their log files, the
transfer ledger and the execution log of :mod:`tests.acceptance.durable_app`, and the test
process's own copy of the app. Every wait has a deadline; :meth:`Cluster.close` kills whatever
is still running. Workers connect with ``application_name=turnstile-worker``, so a test can find
(and terminate) their database backends in ``pg_stat_activity``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import psycopg
from sqlalchemy.engine import make_url

from examples.banking import read_ledger
from tests.acceptance.durable_app import DurableApp, make_app
from tests.databases import libpq_dsn

REPO_ROOT = Path(__file__).resolve().parents[2]
APP_SPEC = "tests.acceptance.durable_app:ai"
WORKER_APPLICATION_NAME = "turnstile-worker"
#: Statuses of a turn that has not settled yet.
ACTIVE = ("pending", "aborting")

T = TypeVar("T")


@dataclass
class Worker:
    """One ``turnstile worker`` process and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    _log_file: IO[bytes]
    stopped: bool = False

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    @property
    def alive(self) -> bool:
        """Whether the process has not exited."""
        return self.process.poll() is None

    def log(self) -> str:
        """Everything the worker wrote to stdout/stderr so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, signum: int) -> None:
        """Send ``signum`` to this worker (only this process, by its id)."""
        if self.alive:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the worker and reap it."""
        self.signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: the process freezes where it is (threads, timers, sockets and all)."""
        self.signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self.signal(signal.SIGCONT)
        self.stopped = False

    def close(self) -> None:
        """Kill the process if it still runs, reap it and close its log file."""
        if self.alive:
            if self.stopped:
                self.resume()
            self.kill()
        else:
            self.process.wait(timeout=10)
        self._log_file.close()


async def eventually(
    check: Callable[[], Awaitable[T | None]],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    describe: Callable[[], str] = lambda: "",
) -> T:
    """Poll the async ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{describe()}")
        await asyncio.sleep(interval)


@dataclass
class Cluster:
    """A database, the worker processes on it, and what they leave behind."""

    url: str
    tmp_path: Path
    #: Settings shared by the test's app and every worker (see ``make_app``).
    settings: dict[str, Any] = field(
        default_factory=lambda: {
            "lease_seconds": 2.0,
            "transfer_seconds": 0.0,
            "model_after_tool_seconds": 0.0,
            "approval_timeout": 1.0,
        }
    )
    workers: list[Worker] = field(default_factory=list)
    _app: DurableApp | None = None

    # -- paths and URLs -------------------------------------------------------------------

    @property
    def ledger(self) -> Path:
        """The transfer ledger every process books into."""
        return self.tmp_path / "ledger.jsonl"

    @property
    def executions_path(self) -> Path:
        """The execution log (``start|done <key> <pid>`` lines)."""
        return self.tmp_path / "executions.log"

    @property
    def dsn(self) -> str:
        """A plain libpq URL of the database, for the test's own SQL."""
        return libpq_dsn(self.url)

    @property
    def worker_url(self) -> str:
        """The URL workers get: tagged with their application name."""
        url = make_url(self.url).update_query_dict({"application_name": WORKER_APPLICATION_NAME})
        return url.render_as_string(hide_password=False)

    # -- the app and the workers ------------------------------------------------------------

    def configure(self, **settings: Any) -> None:
        """Change the shared settings (before the app or any worker is started)."""
        assert self._app is None and not self.workers, "configure before starting anything"
        unknown = set(settings) - set(self.settings)
        assert not unknown, f"unknown settings {unknown}"
        self.settings.update(settings)

    def app(self) -> DurableApp:
        """The test process's copy of the app (it only queues turns: workers run them)."""
        if self._app is None:
            self._app = make_app(
                self.url, ledger=self.ledger, executions=self.executions_path, **self.settings
            )
        return self._app

    def process_env(self) -> dict[str, str]:
        """The environment of a process serving the app: the shared settings, the ledger and
        the execution log."""
        return {
            "TEST_LEDGER": str(self.ledger),
            "TEST_EXECUTIONS": str(self.executions_path),
            "TEST_LEASE_SECONDS": str(self.settings["lease_seconds"]),
            "TEST_TRANSFER_SECONDS": str(self.settings["transfer_seconds"]),
            "TEST_MODEL_AFTER_TOOL_SECONDS": str(self.settings["model_after_tool_seconds"]),
            "TEST_APPROVAL_TIMEOUT": str(self.settings["approval_timeout"]),
        }

    def start_worker(self, *, concurrency: int = 4) -> Worker:
        """Start a ``turnstile worker`` process on this database."""
        name = f"worker{len(self.workers) + 1}"
        log_path = self.tmp_path / f"{name}.log"
        log_file = log_path.open("wb")
        env = {
            **os.environ,
            **self.process_env(),
            "TURNSTILE_DATABASE_URL": self.worker_url,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
            ),
        }
        command = [
            sys.executable,
            "-m",
            "workers.cli",
            "worker",
            "--app",
            APP_SPEC,
            "--concurrency",
            str(concurrency),
            "--poll-interval",
            "0.2",
            "--shutdown-grace",
            "1",
        ]
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        worker = Worker(name=name, process=process, log_path=log_path, _log_file=log_file)
        self.workers.append(worker)
        return worker

    async def wait_ready(self, *workers: Worker, timeout: float = 30.0) -> None:
        """Wait until each worker's pool logged that it is serving (and is claiming)."""

        async def ready() -> bool:
            for worker in workers:
                if not worker.alive:
                    raise AssertionError(f"{worker.name} exited early\n{self.logs()}")
            return all(" serving " in w.log() for w in workers)

        await eventually(ready, timeout=timeout, what="workers to start", describe=self.logs)

    def logs(self) -> str:
        """Every worker's log, labelled (for assertion messages)."""
        parts = []
        for worker in self.workers:
            state = "running" if worker.alive else f"exit {worker.process.returncode}"
            parts.append(f"----- {worker.name} (pid {worker.pid}, {state}) -----\n{worker.log()}")
        return "\n".join(parts)

    async def close(self) -> None:
        """Kill every worker still running, print their logs, close the app's store."""
        for worker in self.workers:
            worker.close()
        if self.workers:
            print(self.logs())
        if self._app is not None:
            await self._app.store.close()

    # -- reading what happened ------------------------------------------------------------

    async def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one SQL statement on a fresh connection (in a thread) and return its rows."""

        def run() -> list[tuple[Any, ...]]:
            with psycopg.connect(self.dsn, autocommit=True) as connection:
                cursor = connection.execute(sql, params)
                return cursor.fetchall() if cursor.description else []

        return await asyncio.to_thread(run)

    async def scalar(self, sql: str, params: Any = None) -> Any:
        """The first column of the first row of ``sql``."""
        rows = await self.query(sql, params)
        return rows[0][0] if rows else None

    async def wait_all_settled(self, *, timeout: float) -> None:
        """Wait until no turn in the database is pending or aborting."""

        async def settled() -> bool:
            busy: int = await self.scalar(
                "SELECT count(*) FROM turns WHERE status IN ('pending', 'aborting')"
            )
            return busy == 0

        await eventually(
            settled, timeout=timeout, interval=0.2, what="every turn to settle", describe=self.logs
        )

    async def wait_claimed(self, turn_id: str, *, timeout: float = 15.0) -> str:
        """Wait until a worker holds ``turn_id``; returns its ``lease_owner``."""

        async def owner() -> str | None:
            holder: str | None = await self.scalar(
                "SELECT lease_owner FROM turns WHERE id = %s", (turn_id,)
            )
            return holder

        return await eventually(
            owner, timeout=timeout, what=f"a worker to claim {turn_id}", describe=self.logs
        )

    @contextlib.asynccontextmanager
    async def holding(self, *statements: str) -> AsyncIterator[int]:
        """Run ``statements`` in a transaction of the test's own connection and keep it open
        (with its locks) until the block exits; yields that connection's backend pid."""
        async with await psycopg.AsyncConnection.connect(self.dsn) as connection:
            for statement in statements:
                await connection.execute(statement)
            try:
                yield connection.info.backend_pid
            finally:
                await connection.rollback()

    async def terminate_blocked(self, blocker: int, *, times: int, within: float) -> int:
        """Terminate the worker backends waiting on a lock of backend ``blocker``, as each one
        shows up, until ``times`` were terminated or none shows up for ``within`` seconds;
        returns how many were terminated."""
        killed = 0
        while killed < times:
            deadline = time.monotonic() + within
            while True:
                rows = await self.query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s AND %s = ANY(pg_blocking_pids(pid))",
                    (WORKER_APPLICATION_NAME, blocker),
                )
                if rows:
                    killed += sum(1 for (ok,) in rows if ok)
                    break
                if time.monotonic() > deadline:
                    return killed
                await asyncio.sleep(0.01)
        return killed

    def executions(self) -> list[tuple[str, str, int]]:
        """The execution log as ``(event, idempotency key, pid)`` tuples, in order."""
        if not self.executions_path.exists():
            return []
        entries = []
        for line in self.executions_path.read_text().splitlines():
            event, key, pid = line.split(" ")
            entries.append((event, key, int(pid)))
        return entries

    def executions_of(self, key: str, event: str) -> list[int]:
        """The pids that logged ``event`` for ``key``, in order."""
        return [pid for e, k, pid in self.executions() if e == event and k == key]

    async def wait_execution(self, prefix: str, event: str, *, timeout: float = 15.0) -> str:
        """Wait for an execution-log ``event`` whose key starts with ``prefix``; its key."""

        async def found() -> str | None:
            keys = [k for e, k, _ in self.executions() if e == event and k.startswith(prefix)]
            return keys[0] if keys else None

        return await eventually(
            found, timeout=timeout, what=f"{event} of a call {prefix}*", describe=self.logs
        )

    def ledger_keys(self) -> Counter[str]:
        """How often each idempotency key was booked in the ledger."""
        return Counter(entry["key"] for entry in read_ledger(self.ledger))

    def claims(self) -> dict[str, list[tuple[str, int]]]:
        """Per worker name, the ``(turn id, attempt)`` claims its log reports."""
        pattern = re.compile(r"turn (\S+) attempt (\d+) claimed")
        return {
            w.name: [(m[1], int(m[2])) for m in pattern.finditer(w.log())] for w in self.workers
        }

    async def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of the tables a worker writes, as text, in a stable order."""
        tables = {
            "sessions": "id",
            "turns": "id",
            "turn_events": "id",
            "messages": "turn_id, round, position",
            "tool_calls": "turn_id, round, ref",
        }
        return {
            table: await self.query(f"SELECT t::text FROM {table} t ORDER BY {order}")
            for table, order in tables.items()
        }
