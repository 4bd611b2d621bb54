"""Approval workflows per second, end to end, on the local PostgreSQL — the floor, a peer.

``python bench/approvals.py [--workflows N] [--quick]``

For each configuration (worker processes x slots per process, default {1, 4} x {1, 8}) the
benchmark runs, on a fresh database each time:

* **turnstile** — P processes of ``python -m workers.cli worker --app bench.app:ai
  --concurrency S`` and, in this process, ``--clients`` concurrent chats each doing
  ``chat.send("Transfer $k to acct k")`` (returns paused at the userApproval interrupt) then
  ``chat.resume(respond=[approve])`` (returns the final answer);
* **turnstile-embedded** — the same clients, with one of the P pools in this process: a
  ``WorkerPool`` of S slots on the clients' own store and event loop (as ``turnstile serve
  --workers S`` runs one), from before the warm-up until after the idle phase, plus P - 1
  worker processes as above (``--processes 1``: the embedded pool alone). Its claims are
  timestamped like the worker processes'; its client CPU includes the pool's work;
* **floor** — the same workload in raw psycopg writing the minimum rows that keep the
  product's recovery guarantees (``bench/floor.py``); ``--impl`` can add
  **floor-settle-only**, the floor without the transfer round's two checkpoints (what
  earlier rounds were measured against);
* **langgraph** — a peer: the same workflow as a LangGraph graph checkpointed by
  ``PostgresSaver``, in P processes of S threads each (``bench/langgraph_peer.py``);
  **langgraph-async** is ``AsyncPostgresSaver`` with S asyncio tasks per process. A peer
  has no queue and no workers: its processes run the workflows themselves, S at a time
  each (``--clients`` does not apply), with ``--langgraph-durability`` (default ``sync``).
  The peers need the optional ``bench`` dependencies (not in ``dev``; the tests do not)::

      .venv/bin/pip install -e '.[bench]'
      .venv/bin/python bench/approvals.py --impl turnstile,floor,langgraph \\
          --processes 1 --slots 1,8 --rounds 3 --workflows 800 --idle 50

With ``--rounds`` the implementations alternate within each configuration, and the
throughput of each of Turnstile's configurations (turnstile, turnstile-embedded) is reported
as a share of the floor's and as a multiple of each peer's (medians of the rounds' ratios)::

    .venv/bin/python bench/approvals.py --impl turnstile,turnstile-embedded,langgraph \\
        --processes 1 --slots 1,8 --workflows 300 --idle 20

It reports workflows/s, the resume→pickup / resume→settled / resume→returned latencies (a
peer: only returned), and per workflow: commits, writing transactions, WAL bytes and
records, full-page images, WAL syncs and CPU time.
``docs/performance.md`` defines every number. Run nothing else on the server meanwhile:
WAL counters and transaction ids are cluster-wide.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import cProfile
import importlib
import json
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import psycopg
from sqlalchemy.engine import make_url

from bench import floor
from bench.common import (
    STATE_KEYS,
    ClaimClock,
    Databases,
    Processes,
    Sample,
    add_what_if_option,
    apply_what_ifs,
    checkpoint,
    count_backends,
    drive,
    dsn_for,
    machine,
    raise_on_sigterm,
    read_claims,
    read_stats,
    server_cpu_seconds,
    url_for,
    wait_until_idle,
)
from bench.report import (
    EMBEDDED,
    FLOORS,
    IMPLS,
    PEERS,
    SETTLE_ONLY,
    Latencies,
    Result,
    is_floor,
    is_ours,
    is_peer,
    report,
)
from stores.notify import LISTEN_STATEMENT

if TYPE_CHECKING:
    from engine import Engine
    from engine.store import SessionStore

Workflow = Callable[[int, int], Awaitable[Sample]]
Phases = tuple[list[Sample], list[Sample], list[str], float]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _phases(
    workflow: Workflow, args: argparse.Namespace, watch: Callable[[], None]
) -> Phases:
    """Warm-up, then the throughput phase (all clients), then the latency phase (one client).

    Returns the throughput samples, the latency samples, every error and the throughput
    phase's wall time.
    """
    n, warmup = args.workflows, args.warmup
    _, errors, _ = await drive(warmup, args.clients, workflow, watch=watch, offset=n)
    profiler = cProfile.Profile(time.thread_time) if args.profile else None
    if profiler is not None:
        profiler.enable()
    loaded, more, seconds = await drive(n, args.clients, workflow, watch=watch)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile / f"client-{os.getpid()}-{time.time():.0f}.prof")
    idle, last, _ = await drive(args.idle, 1, workflow, watch=watch, offset=n + warmup)
    return loaded, idle, errors + more + last, seconds


async def turnstile_clients(
    url: str,
    args: argparse.Namespace,
    watch: Callable[[], None],
    *,
    embedded_slots: int = 0,
    claim_log: Path | None = None,
    listening: int = 1,
) -> Phases:
    """The product's client side: concurrent chats on one store, in this process.

    With ``embedded_slots``, also a worker pool of that many slots on the same store, in
    this event loop, running from before the warm-up until after the idle phase; its claims
    are appended to ``claim_log`` (read like the worker processes' claim logs). The phases
    start once ``listening`` backends listen for work: the worker processes' and the pool's.
    """
    os.environ["TURNSTILE_DATABASE_URL"] = url  # examples.banking builds a (lazy) app on import
    from examples.banking import build
    from stores import SqlSessionStore

    pool_size = None
    if embedded_slots:
        from stores.sql import default_pool_size
        from workers.cli.startup import worker_pool_size

        # The connections the clients' store and a worker process's store would have had
        # apart, so the embedded pool does not wait for connections the other configuration
        # had to spare.
        pool_size = default_pool_size() + worker_pool_size(embedded_slots)
    store = SqlSessionStore(url, pool_size=pool_size)
    app = build(store=store, state_keys=STATE_KEYS)
    agent = app.banking_agent

    async def workflow(client: int, k: int) -> Sample:
        chat = agent.chat()
        paused = await chat.send(f"Transfer ${k + 1} to acct {k}")
        approval = next(i for i in paused.interrupts if i.name == "userApproval")
        resume_at = time.time()
        done = await chat.resume(respond=[approval.respond({"approved": True})])
        done_at = time.time()
        if done.text != f"Done. Transaction txn-{k + 1}-acct-{k}.":
            raise RuntimeError(f"unexpected answer {done.text!r}")
        assert done.snapshot_id is not None
        return Sample(done.snapshot_id, resume_at, done_at)

    try:
        if not embedded_slots:
            return await _phases(workflow, args, watch)
        ready = (make_url(url).database or "", listening)
        return await _with_embedded_pool(
            app.ai, store, embedded_slots, claim_log, ready, workflow, args, watch
        )
    finally:
        await store.close()


async def _with_embedded_pool(
    engine: Engine,
    store: SessionStore,
    slots: int,
    claim_log: Path | None,
    ready: tuple[str, int],
    workflow: Workflow,
    args: argparse.Namespace,
    watch: Callable[[], None],
) -> Phases:
    """The phases with a :class:`~workers.pool.WorkerPool` of ``slots`` slots running in
    this event loop, set up as ``turnstile worker`` sets up its pool (the default poll
    interval, grace and maintenance jobs), observed by a :class:`ClaimClock`. ``ready``:
    the database and how many backends listen for work once the pool does."""
    from workers.pool import WorkerPool

    clock = ClaimClock(claim_log, at_exit=False)
    pool = WorkerPool(engine, store=store, concurrency=slots, observers=[clock])
    stop = asyncio.Event()
    running = asyncio.create_task(pool.run(stop), name="embedded worker pool")

    def watch_all() -> None:
        watch()
        if running.done():
            problem = "cancelled" if running.cancelled() else repr(running.exception())
            raise RuntimeError(f"the embedded worker pool stopped during the run: {problem}")

    try:
        # Like start_workers: measure from when every pool listens for work (the store's
        # listener starts once the pool first waits for work; the worker processes already
        # listen), so no warm-up turn waits for a poll instead.
        database, listening = ready
        deadline = time.monotonic() + 60
        while await asyncio.to_thread(count_backends, database, LISTEN_STATEMENT) < listening:
            watch_all()
            if time.monotonic() > deadline:
                raise RuntimeError("the embedded worker pool not listening after 60 s")
            await asyncio.sleep(0.1)
        return await _phases(workflow, args, watch_all)
    finally:
        stop.set()  # then running turns finish (or are handed back after the grace period)
        await running
        clock.write()


async def _floor_clients(dsn: str, args: argparse.Namespace, watch: Callable[[], None]) -> Phases:
    """The floor's client side (``bench/floor.py``)."""
    async with floor.FloorClient(dsn) as client:
        return await _phases(client.workflow, args, watch)


def _peer_phases(
    impl: str, dsn: str, processes: int, slots: int, args: argparse.Namespace
) -> tuple[Phases, float]:
    """A peer's phases (``bench/langgraph_peer.py``), as :func:`_phases` runs Turnstile's:
    warm-up and throughput with every process running ``slots`` workflows at a time, then
    one workflow at a time in one process. Also returns the processes' start-up CPU."""
    from bench import langgraph_peer  # the optional dependencies: only when asked for

    n, warmup = args.workflows, args.warmup
    durability = args.langgraph_durability
    with langgraph_peer.Peer(impl, dsn, processes, slots, durability) as peer:
        _, errors, _ = peer.phase(n, warmup)
        loaded, more, seconds = peer.phase(0, n)
        idle, last, _ = peer.phase(n + warmup, args.idle, width=1, processes=1)
    return (loaded, idle, errors + more + last, seconds), peer.start_up_cpu


def start_workers(
    impl: str,
    processes: int,
    slots: int,
    name: str,
    children: Processes,
    logs: Path,
    profile: Path | None = None,
) -> None:
    """Start the worker processes and wait until each one LISTENs (under cProfile, writing
    ``<profile>/<impl>-<P>p<S>s-w<n>.prof`` when they stop, if ``profile`` is set)."""
    url, dsn = url_for(name), dsn_for(name)
    for number in range(processes):
        claim_log = logs / f"claims-{number}.log"
        env = dict(os.environ, TURNSTILE_BENCH_CLAIM_LOG=str(claim_log))
        if is_floor(impl):
            argv = ["bench.floor", "worker", "--dsn", dsn, "--claim-log", str(claim_log)]
            argv += ["--slots", str(slots)]
            if impl == SETTLE_ONLY:
                argv.append("--settle-only")
        else:
            argv = ["workers.cli", "worker", "--app", "bench.app:ai", "--db", url]
            argv += ["--observer", "bench.app:claims"]
            argv += ["--concurrency", str(slots)]
        if profile is not None:
            out = profile / f"{impl}-{processes}p{slots}s-w{number}.prof"
            argv = ["bench.profiled", str(out), *argv]
        children.start([sys.executable, "-m", *argv], env=env, log=logs / f"w{number}.log")
    ready = floor.READY_QUERY if is_floor(impl) else LISTEN_STATEMENT
    deadline = time.monotonic() + 60
    while count_backends(name, ready) < processes:
        children.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not listening after 60 s; see {logs}")
        time.sleep(0.1)


def _turn_times(dsn: str, table: str, ids: list[str]) -> tuple[dict[str, float], ...]:
    """``created_at`` and ``settled_at`` (unix seconds) of the given turns."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        rows = connection.execute(
            f"""SELECT id, extract(epoch FROM created_at)::float8,
                       extract(epoch FROM settled_at)::float8
                FROM {table} WHERE id = ANY(%s)""",
            (ids,),
        ).fetchall()
    return {r[0]: r[1] for r in rows}, {r[0]: r[2] for r in rows if r[2] is not None}


@dataclass(frozen=True)
class Bench:
    """What every measurement of one benchmark run shares."""

    args: argparse.Namespace
    databases: Databases
    children: Processes
    template: str  # the migrated database each turnstile run copies
    workdir: Path  # worker logs and claim logs, one folder per run


def measure(bench: Bench, impl: str, processes: int, slots: int, round: int = 1) -> Result:
    """One implementation on one configuration, on a fresh database (dropped afterwards)."""
    args, databases, children = bench.args, bench.databases, bench.children
    copy = bench.template if is_ours(impl) else None  # peers and floors: their own
    name = databases.create(
        f"{impl.replace('-', '_')}_{processes}p{slots}s_r{round}", template=copy
    )
    logs = bench.workdir / name
    logs.mkdir()
    dsn = dsn_for(name)
    try:
        if is_floor(impl):
            with psycopg.connect(dsn, autocommit=True) as connection:
                connection.execute(floor.SCHEMA)
        elif is_peer(impl):
            from bench import langgraph_peer

            langgraph_peer.setup(dsn)  # the saver's tables (PostgresSaver.setup())
        checkpoint()
        cpu_children, cpu_self = _children_cpu(), _self_cpu()
        before, server_before = read_stats(name), server_cpu_seconds()
        if is_peer(impl):
            phases, start_up = _peer_phases(impl, dsn, processes, slots, args)
            loaded, idle, errors, seconds = phases
        else:
            # turnstile-embedded: the benchmark process runs one of the P pools itself.
            separate = processes - 1 if impl == EMBEDDED else processes
            try:
                start_workers(impl, separate, slots, name, children, logs, args.profile)
                # Not per-workflow work: importing, connecting, checking the schema (≈ 0.5 s
                # of CPU for each of our workers), counted apart so four processes do not
                # look like four times the cost per workflow.
                start_up = children.cpu_seconds()
                if is_floor(impl):
                    run = _floor_clients(dsn, args, children.check)
                else:
                    run = turnstile_clients(
                        url_for(name),
                        args,
                        children.check,
                        embedded_slots=slots if impl == EMBEDDED else 0,
                        claim_log=logs / "claims-embedded.log",
                        listening=processes,
                    )
                loaded, idle, errors, seconds = asyncio.run(run)
            finally:
                children.stop()
        wait_until_idle(name)
        stats, server_after = read_stats(name) - before, server_cpu_seconds()
        server_cpu = (
            server_after - server_before
            if server_after is not None and server_before is not None
            else None
        )
        claims = read_claims(logs)
        ids = [s.resumed_turn for s in loaded + idle]
        if is_peer(impl):  # no queue: no pickup, no turn rows (its samples carry thread ids)
            created, settled = {}, {}
        else:
            created, settled = _turn_times(dsn, "fturns" if is_floor(impl) else "turns", ids)
        return Result(
            impl=impl,
            processes=processes,
            slots=slots,
            round=round if bench.args.rounds > 1 else None,
            warmup=args.warmup,
            workflows=args.workflows,
            idle_workflows=args.idle,
            seconds=seconds,
            loaded=Latencies.of(loaded, claims, created, settled),
            idle=Latencies.of(idle, claims, created, settled),
            stats=stats,
            client_cpu_s=_self_cpu() - cpu_self,
            worker_cpu_s=_children_cpu() - cpu_children - start_up,
            server_cpu_s=server_cpu,
            errors=errors,
        )
    finally:
        databases.drop(name)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run every configuration, print the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workflows", type=int, default=2000, help="measured per run")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 100 workflows")
    parser.add_argument(
        "--clients",
        type=int,
        default=32,
        help="concurrent client chats (ours, floors; a peer runs P x S at a time)",
    )
    parser.add_argument("--warmup", type=int, help="untimed workflows first (default: clients)")
    parser.add_argument("--idle", type=int, default=200, help="workflows run one at a time")
    parser.add_argument("--processes", default="1,4", help="worker processes, e.g. 1,4")
    parser.add_argument("--slots", default="1,8", help="slots per process, e.g. 1,8")
    parser.add_argument(
        "--impl",
        default="turnstile,floor",
        help="a comma-separated choice of turnstile, turnstile-embedded (one of the P pools "
        "in this process), floor, floor-settle-only, langgraph, langgraph-async; 'both' is "
        "turnstile,floor; 'all' adds floor-settle-only (the peers need pip install -e "
        "'.[bench]')",
    )
    parser.add_argument(
        "--langgraph-durability",
        choices=("sync", "async", "exit"),
        default="sync",
        help="the peers' durability mode: sync (each step's checkpoint written before the "
        "next step starts, the guarantees Turnstile keeps; the default here), async "
        "(LangGraph's default: written while the next step runs) or exit",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure each configuration this many times, the implementations alternating; "
        "the targets are judged on the median of the rounds' ratios (for a machine whose "
        "speed drifts between runs)",
    )
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--keep-logs", action="store_true", help="keep worker logs")
    parser.add_argument(
        "--profile",
        type=Path,
        help="write cProfile stats here: the client's throughput phase and each worker "
        "process (slows both; for finding hot spots, not for figures)",
    )
    add_what_if_option(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.workflows, args.idle = min(args.workflows, 100), min(args.idle, 20)
    if args.warmup is None:
        args.warmup = args.clients
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    aliases = {"both": ("turnstile", "floor"), "all": ("turnstile", *FLOORS)}
    asked = {i for word in args.impl.split(",") for i in aliases.get(word, (word,))}
    impls = [i for i in IMPLS if i in asked]
    if not asked <= set(IMPLS):
        parser.error(f"--impl {args.impl!r}: expected some of {', '.join(IMPLS)}, both or all")
    if asked & set(PEERS):
        try:
            importlib.import_module("bench.langgraph_peer")
        except ImportError as exc:
            parser.error(f"{exc}: the peers need pip install -e '.[bench]'")
    raise_on_sigterm()
    databases = Databases(f"turnstile_bench_{os.getpid()}")
    children = Processes()
    workdir = Path(tempfile.mkdtemp(prefix="turnstile-bench-"))
    results: list[Result] = []
    failures: list[str] = []
    try:
        print("machine:", ", ".join(f"{k} {v}" for k, v in machine().items()), flush=True)
        template = databases.create("template")
        from stores import migrate

        migrate(url_for(template))
        apply_what_ifs(template, args.what_if)
        bench = Bench(args, databases, children, template, workdir)
        runs = [
            (processes, slots, round, impl)
            for processes in _ints(args.processes)
            for slots in _ints(args.slots)
            for round in range(1, args.rounds + 1)
            for impl in impls
        ]
        for processes, slots, round, impl in runs:
            label = f"{processes}p x {slots}s {impl}"
            if args.rounds > 1:
                label += f" #{round}"
            try:
                result = measure(bench, impl, processes, slots, round)
            except Exception as exc:  # report it, keep the logs, go on with the rest
                failures.append(f"{label}: {exc!r}")
                print(f"{label}: FAILED: {exc!r}", flush=True)
                args.keep_logs = True
                continue
            results.append(result)
            print(
                f"{label}: {result.rate:.1f} workflows/s ({args.workflows} in "
                f"{result.seconds:.1f} s, {len(result.errors)} errors)",
                flush=True,
            )
        print()
        print(report(results))
        for failure in failures:
            print(f"  FAILED {failure}")
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    finally:
        children.stop()
        databases.close()
        if args.keep_logs:
            print(f"worker logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("interrupted; databases dropped and worker processes stopped", file=sys.stderr)
        raise SystemExit(130) from None
