"""`turnstile worker` started before its database can take connections: it waits, logging
why, and starts once the database is up; only a reachable database at the wrong schema
makes it refuse to start (exit 2), and a database that never comes up ends the wait (exit 1).

The database that comes up late is a PostgreSQL cluster of the test's own (initdb in a
temporary directory, on a free port), so the machine's shared server is never stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import psycopg
import pytest
from sqlalchemy.engine import make_url

from stores import migrate
from tests.acceptance.durable_app import make_app
from tests.acceptance.durable_support import REPO_ROOT, eventually
from tests.databases import ADMIN_URL, libpq_dsn

APP_SPEC = "tests.acceptance.durable_app:ai"


def _postgres_bindir() -> Path | None:
    """The newest installed PostgreSQL's binaries (Debian layout), if any."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary directory on a free port, run by this test only
    (as user ``postgres`` when the test runs as root, since the server refuses root)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.user = "postgres" if os.geteuid() == 0 else None
        self.root = Path(tempfile.mkdtemp(prefix="turnstile-pg-"))
        if self.user is not None:
            account = pwd.getpwnam(self.user)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self.data = self.root / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        )

    def _run(self, program: str, *args: str) -> None:
        subprocess.run(
            [str(self.bindir / program), *args],
            user=self.user,
            cwd=self.root,
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self, *, standby: bool = False) -> None:
        """Start the server; a ``standby`` stays in recovery, refusing every connection,
        until :meth:`promote`."""
        assert self.process is None
        options = ["-c", "fsync=off", "-c", "listen_addresses=127.0.0.1"]
        if standby:
            signal_file = self.data / "standby.signal"
            signal_file.touch()
            if self.user is not None:
                account = pwd.getpwnam(self.user)
                os.chown(signal_file, account.pw_uid, account.pw_gid)
            options += ["-c", "hot_standby=off"]
        self._log = (self.root / "server.log").open("ab")
        self.process = subprocess.Popen(
            [
                str(self.bindir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                *options,
            ],
            user=self.user,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def promote(self) -> None:
        """End a standby's recovery: the server takes connections from then on."""
        self._run("pg_ctl", "promote", "-w", "-D", str(self.data))

    def connect_error(self) -> str | None:
        """Why a connection fails right now, or ``None`` if one succeeds."""
        try:
            with psycopg.connect(self.url, connect_timeout=2):
                return None
        except psycopg.OperationalError as exc:
            return str(exc)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the server takes connections."""
        deadline = time.monotonic() + timeout
        while (error := self.connect_error()) is not None:
            assert time.monotonic() < deadline, f"server not ready: {error}\n{self.log()}"
            time.sleep(0.05)

    def stop(self) -> None:
        """Fast shutdown of the server this object started, and wait for it to exit."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        assert self._log is not None
        self._log.close()

    def log(self) -> str:
        """The server's log so far."""
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def remove(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def late_postgres() -> Iterator[ThrowawayPostgres]:
    """A throwaway cluster migrated to head and then stopped: up to the test to start."""
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run a server as")
    cluster = ThrowawayPostgres(bindir)
    try:
        cluster.start()
        cluster.wait_ready()
        migrate(cluster.url)
        cluster.stop()
        yield cluster
    finally:
        cluster.remove()


class WorkerProcess:
    """``python -m workers.cli worker`` on the durable test app, its output in a file."""

    def __init__(self, tmp_path: Path, url: str, *extra: str) -> None:
        self.log_path = tmp_path / "worker.log"
        self._log = self.log_path.open("wb")
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
            ),
        }
        env.pop("TURNSTILE_DATABASE_URL", None)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workers.cli",
                "worker",
                "--app",
                APP_SPEC,
                "--db",
                url,
                "--poll-interval",
                "0.2",
                "--shutdown-grace",
                "1",
                *extra,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        """Everything the worker wrote so far."""
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """Wait for the worker to exit; its status."""
        return self.process.wait(timeout=timeout)

    def close(self) -> None:
        """Stop the worker (SIGTERM, then SIGKILL) if it still runs, and close its log."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()


@contextlib.contextmanager
def worker_process(tmp_path: Path, url: str, *extra: str) -> Iterator[WorkerProcess]:
    """A worker process for the block; stopped (and its log printed) at the end."""
    worker = WorkerProcess(tmp_path, url, *extra)
    try:
        yield worker
    finally:
        worker.close()
        print(worker.log())


@pytest.mark.timeout(120)
async def test_worker_waits_for_a_database_that_is_down_then_recovering_and_then_runs_turns(
    late_postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    """A worker started while its database is down keeps waiting through the server's
    recovery, logging what it waits for, then starts and claims and runs a turn."""
    with worker_process(tmp_path, late_postgres.url, "--connect-timeout", "60") as worker:

        async def retries_logged(count: int) -> bool:
            assert worker.process.poll() is None, f"worker exited early\n{worker.log()}"
            return worker.log().count("not reachable") >= count

        # Down: nothing listens on the port, and the worker keeps waiting.
        await eventually(lambda: retries_logged(2), timeout=30, what="retries while down")
        assert "Connection refused" in worker.log()
        assert "retrying in" in worker.log()

        # Recovering: the server answers but refuses connections until promoted.
        late_postgres.start(standby=True)
        deadline = time.monotonic() + 30
        while (error := late_postgres.connect_error()) is None or "refused" in error:
            assert time.monotonic() < deadline, f"standby not up\n{late_postgres.log()}"
            await asyncio.sleep(0.05)
        assert "not accepting connections" in error

        async def recovery_logged() -> bool:
            assert worker.process.poll() is None, f"worker exited early\n{worker.log()}"
            return "not accepting connections" in worker.log()

        await eventually(recovery_logged, timeout=30, what="a retry while recovering")
        assert " serving " not in worker.log()

        late_postgres.promote()

        async def serving() -> bool:
            assert worker.process.poll() is None, f"worker exited\n{worker.log()}"
            return " serving " in worker.log()

        await eventually(serving, timeout=30, what="the worker to start serving")

        app = make_app(late_postgres.url)
        try:
            paused = await asyncio.wait_for(
                app.banking_agent.chat().send("Transfer $5 to my savings account."), 30
            )
        finally:
            await app.store.close()
        assert paused.finish_reason == "interrupted", worker.log()
        assert f"turn {paused.snapshot_id} attempt 1 claimed" in worker.log()

        worker.process.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.log()
    assert "Traceback" not in worker.log()


@pytest.fixture
def unmigrated_database() -> Iterator[str]:
    """An empty database on the shared server: reachable, never migrated."""
    name = f"turnstile_unmigrated_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = libpq_dsn(ADMIN_URL)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield libpq_dsn(make_url(ADMIN_URL).set(database=name))
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.timeout(60)
def test_worker_on_a_reachable_database_not_at_head_exits_2_at_once(
    unmigrated_database: str, tmp_path: Path
) -> None:
    """A reachable database that was never migrated is a schema mismatch: the worker exits 2
    without waiting out its connect timeout."""
    started = time.monotonic()
    with worker_process(tmp_path, unmigrated_database, "--connect-timeout", "60") as worker:
        status = worker.wait(timeout=30)
        log = worker.log()
    assert status == 2, log
    assert time.monotonic() - started < 20
    assert "refusing to start" in log and "turnstile migrate" in log
    assert "not reachable" not in log
    assert "Traceback" not in log


@pytest.mark.timeout(60)
def test_worker_gives_up_after_its_connect_timeout_with_exit_1(tmp_path: Path) -> None:
    """With nothing listening on the database's port, the worker retries until
    --connect-timeout runs out, then exits 1 saying the database was not reachable."""
    url = f"postgresql://postgres@127.0.0.1:{_free_port()}/postgres"
    with worker_process(tmp_path, url, "--connect-timeout", "2") as worker:
        status = worker.wait(timeout=30)
        log = worker.log()
    assert status == 1, log
    assert log.count("retrying in") >= 2
    assert "not reachable after 2s" in log
    assert "Traceback" not in log
