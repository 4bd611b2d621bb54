"""CPU, and instructions, per approval workflow with the client and a worker pool in one process.

``python bench/in_process.py [--workflows N] [--slots S]`` runs the banking workflow (send →
pause → resume → done, scripted model) one at a time through a ``WorkerPool`` sharing this
process's event loop and ``SqlSessionStore``, on a fresh PostgreSQL database, and prints CPU
and wall time per workflow (after 30 warm-up workflows).

``python bench/in_process.py --instructions`` runs that twice under ``valgrind
--tool=callgrind`` (30 + 20 and 30 + 80 workflows) and prints the difference per workflow:
the user-space instructions one workflow costs the client and the worker together, start-up
and warm-up cancelled out. Unlike the seconds of ``bench/approvals.py`` this count does not
move with the machine's load or speed (the same code gives the same count to within a few
tenths of a percent), so it can tell a 3% change apart on a machine whose throughput swings
by a third between runs. It leaves out what the kernel does (system calls: count those with
``strace -c -f``) and PostgreSQL's own work.

``python bench/in_process.py --statements`` adds that work, per statement: for every kind of
round trip the store makes on its libpq sessions (named by its statements' first CTEs), how
often a workflow makes it, its wall time, and the CPU its server backend spent on it. The
backend's time comes from ``/proc/<pid>/schedstat`` (nanoseconds on a CPU; the server must be
local), read each time a session starts a round trip: what the backend used since the
session's previous one belongs to that one, since a session's backend is idle in between.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import os
import re
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from bench.common import STATE_KEYS, Databases, url_for

WARMUP = 30


class StatementCosts:
    """Round trips by kind: count, wall seconds, server backend CPU nanoseconds."""

    def __init__(self) -> None:
        self.count: dict[str, int] = defaultdict(int)
        self.wall: dict[str, float] = defaultdict(float)
        self.server_ns: dict[str, int] = defaultdict(int)
        self.counting = False
        # Per backend: its CPU reading at the start of its last round trip, and that trip.
        self._open: dict[int, tuple[int, str]] = {}

    @staticmethod
    def kind(sql: str) -> str:
        """``WITH <first CTE>`` or the statement's first two words."""
        found = re.match(r"\s*WITH\s+(?:RECURSIVE\s+)?(\w+)", sql)
        return f"WITH {found[1]}" if found else " ".join(sql.split()[:2])

    def started(self, backend: int, kind: str) -> None:
        now = _backend_cpu_ns(backend)
        opened = self._open.get(backend)
        if opened is not None and self.counting:
            self.server_ns[opened[1]] += now - opened[0]
        self._open[backend] = (now, kind)

    def finished(self, kind: str, seconds: float) -> None:
        if self.counting:
            self.count[kind] += 1
            self.wall[kind] += seconds

    def close(self) -> None:
        """Charge every session's last round trip (its backend has been idle since)."""
        for backend in list(self._open):
            self.started(backend, "")

    def report(self, workflows: int) -> str:
        lines = [f"{'per workflow':>12}  {'wall ms':>8}  {'server CPU ms':>13}  round trip"]
        for kind in sorted(self.count, key=lambda k: -self.server_ns[k]):
            n = self.count[kind]
            lines.append(
                f"{n / workflows:12.2f}  {1e3 * self.wall[kind] / n:8.3f}  "
                f"{self.server_ns[kind] / n / 1e6:13.3f}  {kind}"
            )
        total = sum(self.server_ns.values()) / workflows / 1e6
        lines.append(f"server CPU per workflow on these sessions: {total:.2f} ms")
        return "\n".join(lines)


def _backend_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as stat:
        return int(stat.read().split()[0])


@contextmanager
def _measured(costs: StatementCosts) -> Iterator[None]:
    """Time every round trip of the store's libpq sessions (measurement only)."""
    from stores import pg

    original = pg._Session.run

    async def run(self: Any, bound: Sequence[tuple[pg.PgStatement, list[Any]]]) -> Any:
        kind = " + ".join(costs.kind(statement.wire_sql.decode()) for statement, _ in bound)
        costs.started(self._pgconn.backend_pid, kind)
        start = time.perf_counter()
        try:
            return await original(self, bound)
        finally:
            costs.finished(kind, time.perf_counter() - start)

    pg._Session.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        pg._Session.run = original  # type: ignore[method-assign]


async def _run(
    workflows: int, slots: int, costs: StatementCosts | None = None
) -> tuple[float, float]:
    """CPU and wall seconds of ``workflows`` workflows after the warm-up (and, with
    ``costs``, their round trips)."""
    from examples.banking import build
    from stores import SqlSessionStore, migrate
    from workers import WorkerPool

    databases = Databases(f"turnstile_in_process_{os.getpid()}")
    try:
        url = url_for(databases.create("db"))
        migrate(url)
        store = SqlSessionStore(url)
        app = build(store=store, state_keys=STATE_KEYS)

        async def workflow(k: int) -> None:
            chat = app.banking_agent.chat()
            paused = await chat.send(f"Transfer ${k + 1} to acct {k}")
            approval = next(i for i in paused.interrupts if i.name == "userApproval")
            done = await chat.resume(respond=[approval.respond({"approved": True})])
            if done.text != f"Done. Transaction txn-{k + 1}-acct-{k}.":
                raise RuntimeError(f"unexpected answer {done.text!r}")

        try:
            async with WorkerPool(app.ai, store, concurrency=slots, scheduler=False):
                for k in range(WARMUP):
                    await workflow(k)
                if costs is not None:
                    costs.counting = True
                cpu, wall = time.process_time(), time.perf_counter()
                for k in range(workflows):
                    await workflow(WARMUP + k)
                elapsed = time.process_time() - cpu, time.perf_counter() - wall
                if costs is not None:
                    costs.close()
                    costs.counting = False
                return elapsed
        finally:
            await store.close()
    finally:
        databases.close()


def _instructions(workflows: int, slots: int) -> int:
    """User-space instructions of a whole run of this script, counted by callgrind."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += [sys.executable, __file__, "--workflows", str(workflows), "--slots", str(slots)]
    run = subprocess.run(command, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count:\n{run.stderr[-2000:]}")
    return int(found[1])


def main() -> None:
    """Parse the options; print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workflows", type=int, default=300, help="measured, one at a time")
    parser.add_argument("--slots", type=int, default=1, help="the pool's concurrency")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per workflow under callgrind (two runs, ~3 minutes)",
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="also print each kind of round trip's wall time and server backend CPU",
    )
    args = parser.parse_args()
    if args.instructions:
        few, many = 20, 80
        counts = [_instructions(n, args.slots) for n in (few, many)]
        per = (counts[1] - counts[0]) / (many - few)
        print(f"{per / 1e6:.2f} M instructions per workflow (client and worker, user space)")
        return
    costs = StatementCosts() if args.statements else None
    if costs is None:
        cpu, wall = asyncio.run(_run(args.workflows, args.slots))
    else:
        with _measured(costs):
            cpu, wall = asyncio.run(_run(args.workflows, args.slots, costs))
        print(costs.report(args.workflows))
    n = args.workflows
    print(
        f"{1e3 * cpu / n:.2f} ms CPU and {1e3 * wall / n:.2f} ms wall per workflow ({n} workflows)"
    )


if __name__ == "__main__":
    main()
