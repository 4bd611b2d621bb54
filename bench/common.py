"""Shared plumbing of the benchmarks: databases, server statistics, child processes, tables.

Everything here talks to the PostgreSQL server of ``DATABASE_URL`` (default: the local server
at 127.0.0.1:5432 as user ``postgres``, like the tests); the benchmarks create their own
databases next to the one in that URL and drop them when they end, however they end.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import math
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import psycopg
from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from engine.store import TurnRecord

__all__ = [
    "ADMIN_URL",
    "REPO",
    "STATE_KEYS",
    "ClaimClock",
    "Databases",
    "Processes",
    "Sample",
    "ServerStats",
    "add_what_if_option",
    "admin",
    "apply_what_ifs",
    "checkpoint",
    "count_backends",
    "drive",
    "dsn_for",
    "fmt",
    "machine",
    "percentile",
    "process_cpu_seconds",
    "raise_on_sigterm",
    "read_claims",
    "read_stats",
    "render_table",
    "url_for",
    "wait_until_idle",
]

#: The repository root (worker processes run there, so ``bench.app`` is importable).
REPO = Path(__file__).resolve().parent.parent
#: Where to connect as an administrator (to create and drop the benchmark databases).
ADMIN_URL = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"


def dsn_for(database: str) -> str:
    """A libpq URL (for psycopg) of ``database`` on the admin server."""
    url = make_url(ADMIN_URL).set(drivername="postgresql", database=database)
    return url.render_as_string(hide_password=False)


def url_for(database: str) -> str:
    """An SQLAlchemy URL (``postgresql+psycopg``, what Turnstile's store takes)."""
    url = make_url(ADMIN_URL).set(drivername="postgresql+psycopg", database=database)
    return url.render_as_string(hide_password=False)


def admin() -> psycopg.Connection[Any]:
    """An autocommit connection to the admin database."""
    return psycopg.connect(dsn_for(make_url(ADMIN_URL).database or "postgres"), autocommit=True)


def add_what_if_option(parser: argparse.ArgumentParser) -> None:
    """``--what-if SQL_FILE`` (repeatable): a schema experiment run on the migrated template."""
    parser.add_argument(
        "--what-if",
        type=Path,
        action="append",
        default=[],
        metavar="SQL_FILE",
        help="run this SQL on Turnstile's migrated template before the runs: a schema "
        "experiment (e.g. dropping a trigger, bench/what_if/*.sql), measured as if it were "
        "the product; its figures are not the product's. Repeat to apply several, in order",
    )


def apply_what_ifs(database: str, what_ifs: Sequence[Path]) -> None:
    """Run each what-if's SQL on ``database``, in order, saying so."""
    if not what_ifs:
        return
    with psycopg.connect(dsn_for(database), autocommit=True) as connection:
        for what_if in what_ifs:
            print(f"what-if: {what_if} on the template (figures are NOT the product's)")
            connection.execute(what_if.read_text())


class Databases:
    """Creates databases named ``<prefix>_<suffix>``; :meth:`close` drops every one left."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.created: list[str] = []

    def create(self, suffix: str, *, template: str | None = None) -> str:
        """Create (or re-create) ``<prefix>_<suffix>``, optionally as a copy of ``template``."""
        name = f"{self.prefix}_{suffix}"
        with admin() as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            copy = f' TEMPLATE "{template}"' if template else ""
            connection.execute(f'CREATE DATABASE "{name}"{copy}')
        self.created.append(name)
        return name

    def drop(self, name: str) -> None:
        """Drop one database made here (its remaining connections are terminated)."""
        with admin() as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.created:
            self.created.remove(name)

    def close(self) -> None:
        """Drop every database still left (newest first); report but survive failures."""
        for name in reversed(list(self.created)):
            try:
                self.drop(name)
            except Exception as exc:  # keep dropping the others
                print(f"warning: could not drop database {name}: {exc}")


@dataclass(frozen=True)
class ServerStats:
    """Counters read from the server; subtract two readings for a delta.

    ``commits`` is ``pg_stat_database.xact_commit`` of one database (every committed
    transaction, read-only ones included). The rest is cluster-wide: ``write_xacts`` is how
    far the next transaction id moved (only writing transactions get one) and the ``wal_*``
    fields come from ``pg_stat_wal``.
    """

    commits: int
    rollbacks: int
    write_xacts: int
    wal_bytes: int
    wal_records: int
    wal_fpi: int
    wal_syncs: int

    def __sub__(self, other: ServerStats) -> ServerStats:
        values = {f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        return ServerStats(**values)


def read_stats(database: str) -> ServerStats:
    """The counters now (a fresh statistics snapshot; no transaction id is consumed)."""
    with admin() as connection:
        connection.execute("SELECT pg_stat_clear_snapshot()")
        row = connection.execute(
            """SELECT d.xact_commit, d.xact_rollback,
                      pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
                      w.wal_bytes, w.wal_records, w.wal_fpi, w.wal_sync
               FROM pg_stat_database d CROSS JOIN pg_stat_wal w
               WHERE d.datname = %s""",
            (database,),
        ).fetchone()
    if row is None:
        raise RuntimeError(f"no statistics for database {database}")
    return ServerStats(*(int(value) for value in row))


def process_cpu_seconds(process: Path, *, reaped: bool = False) -> float:
    """User + system CPU of the process whose /proc folder is ``process`` (with ``reaped``,
    also that of its children it has waited for). Raises OSError once it has gone."""
    # The fields after the command's closing parenthesis: utime, stime, cutime and cstime
    # are the 14th to 17th of the whole line.
    fields = (process / "stat").read_text().rsplit(")", 1)[1].split()
    used = fields[11:15] if reaped else fields[11:13]
    return sum(int(value) for value in used) / os.sysconf("SC_CLK_TCK")


def server_cpu_seconds() -> float | None:
    """User + system CPU the local PostgreSQL server's processes have used so far, exited
    backends included (their time is in the postmaster's reaped-children fields), from
    /proc; ``None`` when none can be read (a remote server, another user's processes).
    Cluster-wide, like the WAL counters: run nothing else on the server meanwhile."""
    total, found = 0.0, False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if (entry / "comm").read_text().startswith("postgres"):
                total += process_cpu_seconds(entry, reaped=True)
                found = True
    return total if found else None


def count_backends(database: str, query: str | None = None) -> int:
    """Backends connected to ``database`` (whose last statement is ``query``, if given)."""
    sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
    params: tuple[str, ...] = (database,)
    if query is not None:
        sql += " AND query = %s"
        params = (database, query)
    with admin() as connection:
        row = connection.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


def wait_until_idle(database: str, timeout: float = 15.0) -> None:
    """Wait until nobody is connected to ``database``: exiting backends flush their
    statistics, so counters read afterwards are complete."""
    deadline = time.monotonic() + timeout
    while count_backends(database) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)  # the last backend's exit-time flush


def checkpoint() -> None:
    """``CHECKPOINT``, so every run starts with the same full-page-write state."""
    with admin() as connection:
        connection.execute("CHECKPOINT")


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    info = {"cpus (nproc)": str(os.cpu_count())}
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory"] = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    names = ("server_version", "shared_buffers", "synchronous_commit", "wal_sync_method")
    with admin() as connection:
        for name in names:
            row = connection.execute(f"SHOW {name}").fetchone()
            info[name] = str(row[0]) if row else "?"
    return info


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def fmt(value: float, digits: int = 1) -> str:
    """A number for a table cell (``-`` for NaN)."""
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        out = [str(cells[0]).ljust(widths[0])]
        out += [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join(out)

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


class Processes:
    """Child processes of a benchmark, each logging to its own file; :meth:`stop` ends them
    (SIGTERM, then SIGKILL after a timeout) — call it in a ``finally``."""

    def __init__(self) -> None:
        self.children: list[tuple[subprocess.Popen[bytes], Path, IO[bytes]]] = []

    def start(self, argv: Sequence[str], *, env: dict[str, str], log: Path) -> None:
        """Start ``argv`` in the repository root with ``env``; output goes to ``log``."""
        handle = log.open("wb")
        try:
            child = subprocess.Popen(
                list(argv), cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT
            )
        except BaseException:
            handle.close()
            raise
        self.children.append((child, log, handle))

    def cpu_seconds(self) -> float:
        """User + system CPU the running children have used so far (from /proc)."""
        total = 0.0
        for child, _, _ in self.children:
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += process_cpu_seconds(Path(f"/proc/{child.pid}"))
        return total

    def check(self) -> None:
        """Raise if a child has exited (with the tail of its log)."""
        for child, log, _ in self.children:
            if child.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{child.args!r} exited with {child.returncode}:\n{tail}")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every child, wait up to ``timeout`` seconds, SIGKILL the rest."""
        for child, _, _ in self.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child, _, handle in self.children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            handle.close()
        self.children.clear()


def raise_on_sigterm() -> None:
    """Make SIGTERM act like Ctrl-C (and Ctrl-C work even when started in the background,
    where the shell ignores SIGINT), so ``finally`` blocks clean up on either."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))


#: Keys for client-managed state (the engine requires some; the benchmark does not use them).
STATE_KEYS = {"bench": "turnstile-bench-key-not-a-secret"}


@dataclass(frozen=True)
class Sample:
    """One measured workflow: the resumed turn and the bench's clock around its resume."""

    resumed_turn: str
    resume_at: float  # time.time() just before the resume call
    done_at: float  # time.time() when the resume call returned the settled response


async def drive(
    n: int,
    clients: int,
    workflow: Callable[[int, int], Awaitable[Sample]],
    *,
    watch: Callable[[], None] | None = None,
    offset: int = 0,
) -> tuple[list[Sample], list[str], float]:
    """Run ``n`` workflows, ``clients`` at a time; ``workflow(client, k)`` runs number ``k``.

    Returns the samples, the errors (``repr`` of each failure) and the wall time in seconds.
    ``watch`` is called every second (e.g. to raise if a worker process died).
    """
    samples: list[Sample] = []
    errors: list[str] = []
    counter = iter(range(offset, offset + n))

    async def client(number: int) -> None:
        for k in counter:
            try:
                async with asyncio.timeout(120):
                    samples.append(await workflow(number, k))
            except Exception as exc:
                errors.append(repr(exc))

    async def watchdog() -> None:
        while watch is not None:
            await asyncio.sleep(1.0)
            watch()

    started = time.perf_counter()
    guard = asyncio.create_task(watchdog())
    work = asyncio.gather(*(client(c) for c in range(min(clients, max(n, 1)))))
    try:
        both: set[asyncio.Future[Any]] = {work, guard}
        done, _ = await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        if guard in done:
            guard.result()  # raises what the watchdog raised
        await work
    finally:  # also on cancellation (Ctrl-C): no client keeps running
        for task in (work, guard):
            task.cancel()
        await asyncio.gather(work, guard, return_exceptions=True)
    return samples, errors, time.perf_counter() - started


class ClaimClock:
    """A :class:`~workers.observers.PoolObserver` that timestamps every claim, in memory, as
    ``<unix time> <turn id> <attempt>`` lines, and appends them to ``path`` on :meth:`write`
    (no file write on the hot path). With ``at_exit``, :meth:`write` also runs when the
    process exits: how a worker process, stopped by a signal, hands its claims over."""

    def __init__(self, path: str | Path | None, *, at_exit: bool = True) -> None:
        self.path = path
        self.lines: list[str] = []
        if path is not None and at_exit:
            atexit.register(self.write)

    def turn_claimed(self, turn: TurnRecord) -> None:
        if self.path is not None:
            self.lines.append(f"{time.time():.6f} {turn.id} {turn.attempts}\n")

    def turn_finished(self, turn: TurnRecord, settled: TurnRecord | None, seconds: float) -> None:
        """Nothing to record: the benchmark times the settle from its own side."""

    def write(self) -> None:
        """Append the claims recorded so far to ``path`` and forget them."""
        if self.path is not None and self.lines:
            with open(self.path, "a", encoding="utf-8") as log:
                log.writelines(self.lines)
            self.lines.clear()


def read_claims(folder: Path) -> dict[str, float]:
    """``turn id -> time of its first claim`` from the ``claims-*.log`` files in ``folder``."""
    first: dict[str, float] = {}
    for path in folder.glob("claims-*.log"):
        for line in path.read_text().splitlines():
            at, turn_id, _attempt = line.split()
            if turn_id not in first or float(at) < first[turn_id]:
                first[turn_id] = float(at)
    return first
