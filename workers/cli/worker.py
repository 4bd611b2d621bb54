"""``turnstile worker --app module:engine``: one :class:`~workers.pool.WorkerPool` for the
app's queued agents, until SIGTERM/SIGINT (a second signal skips the grace period)."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from stores.database import redact
from workers.cli.params import (
    Port,
    Seconds,
    WholeNumber,
    app_option,
    connect_timeout_option,
    db_option,
    dev_option,
    log_options,
    option,
    pool_size_option,
    retry_options,
)
from workers.cli.probes import health_server
from workers.cli.startup import (
    AppFlags,
    Refused,
    TurnstileCommand,
    check_at_head,
    configure_process,
    load_checked_app,
    load_observer,
    log_models,
    worker_pool_size,
)
from workers.pool import WorkerPool

if TYPE_CHECKING:
    from workers.health import HealthServer, Readiness

__all__ = ["WorkerFlags", "run_pool", "run_worker", "worker"]

logger = logging.getLogger("turnstile.cli")


@dataclass(frozen=True)
class WorkerFlags(AppFlags):
    """``turnstile worker``'s options, parsed (see ``docs/configuration.md``)."""

    concurrency: int
    observer: tuple[str, ...]
    poll_interval: float
    shutdown_grace: float
    expiry_interval: float
    retention_days: float | None
    health_port: int | None
    health_host: str


@click.command("worker", cls=TurnstileCommand)
@app_option
@db_option
@option("--concurrency", type=WholeNumber(1), default=4, help="turns run at once (slots)")
@option(
    "--observer",
    multiple=True,
    metavar="MODULE:ATTR",
    help="a PoolObserver told of every turn claimed and finished (repeatable; the variable "
    "takes several separated by spaces)",
)
@option(
    "--poll-interval",
    type=Seconds(positive=True),
    default=1.0,
    help="seconds between claim attempts when no notification comes",
)
@option(
    "--shutdown-grace",
    type=Seconds(),
    default=10.0,
    help="seconds running turns get to finish at stop before they are handed back",
)
@option(
    "--expiry-interval",
    type=Seconds(positive=True),
    default=5.0,
    help="seconds between checks for expired approvals",
)
@option(
    "--retention-days",
    type=Seconds(unit="days"),
    default=None,
    help="delete sessions idle this many days (open approvals are kept) [default: keep all]",
)
@connect_timeout_option
@log_options
@option(
    "--health-port",
    type=Port(),
    default=None,
    help="serve /healthz, /readyz and /metrics on this port [default: none]",
)
@option("--health-host", default="127.0.0.1", help="interface of --health-port")
@retry_options
@pool_size_option("--concurrency // 2 + 2")
@dev_option
def worker(**values: Any) -> int:
    """Run a worker pool for an app's queued agents."""
    return run_worker(WorkerFlags(**values))


def run_worker(flags: WorkerFlags) -> int:
    """Start, run and stop one worker process; its exit status."""
    settings = configure_process(flags)
    pool_size = flags.db_pool_size or worker_pool_size(flags.concurrency)
    app, url, _settings = load_checked_app(flags, settings, pool_size)
    check_at_head(url, flags.connect_timeout)
    try:
        pool = WorkerPool(
            app,
            concurrency=flags.concurrency,
            poll_interval=flags.poll_interval,
            shutdown_grace=flags.shutdown_grace,
            expiry_interval=flags.expiry_interval,
            retention=flags.retention_days * 86400 if flags.retention_days else None,
            observers=[load_observer(spec) for spec in flags.observer],
        )
    except ValueError as exc:
        raise Refused(str(exc)) from exc
    server, readiness = (
        health_server(app, url, pool, flags.health_host, flags.health_port)
        if flags.health_port is not None
        else (None, None)
    )
    log_models(pool.agents.values())
    logger.info(
        "worker %s on %s: concurrency %d, database pool size %d",
        pool.owner,
        redact(url),
        flags.concurrency,
        pool_size,
        extra={
            "database": redact(url),
            "concurrency": flags.concurrency,
            "db_pool_size": pool_size,
        },
    )
    asyncio.run(run_pool(pool, server, readiness))
    return 0


async def run_pool(
    pool: WorkerPool, health: HealthServer | None = None, readiness: Readiness | None = None
) -> None:
    """Run the pool until SIGTERM/SIGINT; a second signal skips the grace period. The health
    server (if any) answers until the pool has stopped, its readiness failing meanwhile."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            logger.warning("second %s: handing running turns back now", name)
            pool.request_stop(force=True)
        else:
            logger.info("%s: no more claims; finishing running turns", name)
            stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        running = asyncio.create_task(pool.run(stop))
        if readiness is not None:
            readiness.watch(running)
        if health is not None:
            await health.start()
        await running
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if health is not None:
            await health.stop()
        if readiness is not None and readiness.database is not None:
            readiness.database.dispose()
        await pool.store.close()
