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

from bench.common import STATE_KEYS, Databases, url_for

WARMUP = 30


async def _run(workflows: int, slots: int) -> tuple[float, float]:
    """CPU and wall seconds of ``workflows`` workflows after the warm-up."""
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
                cpu, wall = time.process_time(), time.perf_counter()
                for k in range(workflows):
                    await workflow(WARMUP + k)
                return time.process_time() - cpu, time.perf_counter() - wall
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
    args = parser.parse_args()
    if args.instructions:
        few, many = 20, 80
        counts = [_instructions(n, args.slots) for n in (few, many)]
        per = (counts[1] - counts[0]) / (many - few)
        print(f"{per / 1e6:.2f} M instructions per workflow (client and worker, user space)")
        return
    cpu, wall = asyncio.run(_run(args.workflows, args.slots))
    n = args.workflows
    print(
        f"{1e3 * cpu / n:.2f} ms CPU and {1e3 * wall / n:.2f} ms wall per workflow ({n} workflows)"
    )


if __name__ == "__main__":
    main()
