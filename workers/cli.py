"""The ``turnstile`` command line: ``turnstile serve``, ``turnstile worker``, ``turnstile migrate``.

Every command takes ``--db URL``; without it the URL comes from ``TURNSTILE_DATABASE_URL``,
else an SQLite file under ``.turnstile/``. ``turnstile worker --app module:engine`` exports the
resolved URL as ``TURNSTILE_DATABASE_URL`` *before* importing the app, so the app builds its
store from it (see :func:`resolve_db_url`), waits up to ``--connect-timeout`` seconds for a
database that cannot be reached yet (down, starting, recovering), refuses to start against one
that is not at the head migration, and stops gracefully on SIGTERM/SIGINT (a second signal
skips the grace). ``turnstile serve``, and ``turnstile worker --health-port``, answer health
probes and Prometheus scrapes (:mod:`workers.health`); ``serve`` runs uvicorn with the
connection limits of :mod:`workers.http_limits`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.metadata
import inspect
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from engine import Engine
from workers.observers import PoolObserver
from workers.pool import WorkerPool

if TYPE_CHECKING:  # imported when used: `turnstile migrate` needs none of them
    from workers.health import HealthServer, Readiness
    from workers.http_limits import ConnectionLimits
    from workers.metrics import Metrics

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_DB_URL",
    "main",
    "redact_url",
    "resolve_db_url",
]

#: The environment variable holding the database URL.
DATABASE_URL_ENV = "TURNSTILE_DATABASE_URL"
#: The embedded default: an SQLite file in ``.turnstile/`` under the current directory.
DEFAULT_DB_URL = "sqlite:///.turnstile/turnstile.db"
#: How long a starting process waits, by default, for a database it cannot reach.
DEFAULT_CONNECT_TIMEOUT = 60.0
#: The first pause between connection attempts at start; it doubles up to the maximum.
CONNECT_RETRY_DELAY = 0.5
MAX_CONNECT_RETRY_DELAY = 2.0
#: Connections a worker's health port keeps open at most (probes and scrapes need few).
HEALTH_PORT_CONNECTIONS = 64

logger = logging.getLogger("turnstile.cli")


class _UsageError(Exception):
    """A problem to report on stderr with exit status 2 (no traceback)."""


class _DatabaseUnreachable(Exception):
    """The database could not be reached within the connect timeout: exit status 1."""


def resolve_db_url(arg: str | None) -> str:
    """The database URL: ``arg``, else ``$TURNSTILE_DATABASE_URL``, else the SQLite default
    (whose ``.turnstile/`` folder is created)."""
    if arg:
        return arg
    from_env = os.environ.get(DATABASE_URL_ENV)
    if from_env:
        return from_env
    Path(".turnstile").mkdir(exist_ok=True)
    return DEFAULT_DB_URL


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs)."""
    return re.sub(r"^([\w+.-]+://[^:/@]*):[^@]*@", r"\1:***@", url)


def _store_hook(name: str) -> Callable[[str], Any] | None:
    """``stores.<name>`` if the installed stores package provides it."""
    import stores

    hook = getattr(stores, name, None)
    return hook if callable(hook) else None


def _call(hook: Callable[[str], Any], url: str) -> None:
    """Call a sync or async store hook, outside any event loop (Alembic may start its own)."""
    result = hook(url)
    if inspect.iscoroutine(result):
        asyncio.run(result)


def _load_attr(spec: str, option: str) -> Any:
    """``module:attribute`` → the attribute (the module imported from the current directory)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise _UsageError(f"{option} must look like 'module:attribute', not {spec!r}.")
    # Console scripts do not put the current directory on sys.path; apps usually live there.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _UsageError(f"cannot import app module {module_name!r}: {exc}") from exc
    found = getattr(module, attr, None)
    if found is None:
        raise _UsageError(f"module {module_name!r} has no attribute {attr!r}.")
    return found


def _load_app(spec: str) -> Engine:
    app = _load_attr(spec, "--app")
    if not isinstance(app, Engine):
        raise _UsageError(f"{spec} is a {type(app).__name__}, not an engine.Engine.")
    return app


def _load_observer(spec: str) -> PoolObserver:
    observer = _load_attr(spec, "--observer")
    if not callable(getattr(observer, "turn_claimed", None)) or not callable(
        getattr(observer, "turn_finished", None)
    ):
        raise _UsageError(
            f"{spec} is a {type(observer).__name__}, not a pool observer "
            "(turn_claimed and turn_finished methods)."
        )
    return cast(PoolObserver, observer)


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) means the database could not be reached — refused,
    starting up, recovering, timed out — rather than that it answered and was found wanting."""
    import sqlite3

    import psycopg
    import sqlalchemy.exc

    kinds = (
        sqlalchemy.exc.OperationalError,
        psycopg.OperationalError,
        sqlite3.OperationalError,
        ConnectionError,
        TimeoutError,
        socket.gaierror,
    )
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kinds):
            return True
        seen = seen.__cause__
    return False


def _reason(exc: BaseException) -> str:
    """The driver's own message for ``exc``, on one line."""
    orig = getattr(exc, "orig", None)  # SQLAlchemy's wrapper adds SQL and a link to its docs
    return " ".join(str(orig if isinstance(orig, BaseException) else exc).split())


@contextlib.contextmanager
def _attempt_timeout(seconds: float) -> Iterator[None]:
    """Bound each connection attempt by the wait left (at most 10 s, libpq's minimum 2 s):
    otherwise one attempt on a host that drops packets could outlast the whole wait."""
    if "PGCONNECT_TIMEOUT" in os.environ:
        yield
        return
    os.environ["PGCONNECT_TIMEOUT"] = str(max(2, min(10, int(seconds + 1))))
    try:
        yield
    finally:
        del os.environ["PGCONNECT_TIMEOUT"]


def _check_at_head(url: str, connect_timeout: float) -> None:
    """Refuse to start unless the schema is at head, waiting with backoff for up to
    ``connect_timeout`` seconds while the database cannot be reached."""
    check = _store_hook("ensure_at_head")
    if check is None:
        return
    started = time.monotonic()
    deadline = started + connect_timeout
    delay = CONNECT_RETRY_DELAY
    waited = False
    while True:
        try:
            with _attempt_timeout(deadline - time.monotonic()):
                _call(check, url)
        except Exception as exc:
            if not _unreachable(exc):
                raise _UsageError(f"refusing to start: {exc}") from exc
            left = deadline - time.monotonic()
            if left <= 0:
                raise _DatabaseUnreachable(
                    f"database {redact_url(url)} not reachable after {connect_timeout:g}s "
                    f"({_reason(exc)}); giving up (see --connect-timeout)"
                ) from exc
            pause = min(delay, left)
            logger.warning(
                "database %s not reachable (%s); retrying in %.1fs",
                redact_url(url),
                _reason(exc),
                pause,
            )
            waited = True
            time.sleep(pause)
            delay = min(2 * delay, MAX_CONNECT_RETRY_DELAY)
            continue
        if waited:
            logger.info(
                "database %s reachable after %.1fs", redact_url(url), time.monotonic() - started
            )
        return


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    # APScheduler logs every job run at INFO (every few seconds), Alembic's schema check a
    # few lines per start: keep them for --log-level DEBUG.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)


def _worker(args: argparse.Namespace, url: str) -> int:
    os.environ[DATABASE_URL_ENV] = url  # read by the app module at import time
    app = _load_app(args.app)
    _configure_logging(args.log_level)  # before the wait for the database, which it reports
    _check_at_head(url, args.connect_timeout)
    try:
        pool = WorkerPool(
            app,
            concurrency=args.concurrency,
            poll_interval=args.poll_interval,
            shutdown_grace=args.shutdown_grace,
            expiry_interval=args.expiry_interval,
            retention=args.retention_days * 86400 if args.retention_days else None,
            observers=[_load_observer(spec) for spec in args.observer],
        )
    except ValueError as exc:
        raise _UsageError(str(exc)) from exc
    health = _health_port(args, app, url, pool) if args.health_port is not None else None
    logger.info("worker %s on %s", pool.owner, redact_url(url))
    server, readiness = health if health is not None else (None, None)
    asyncio.run(_serve(pool, server, readiness))
    return 0


def _durable(app: Engine) -> bool:
    """Whether any agent keeps its turns in a database (then there is a schema to check)."""
    return any(agent.store is not None and agent.store.durable for agent in app.agents.values())


def _observability(app: Engine, url: str, pool: WorkerPool | None) -> tuple[Readiness, Metrics]:
    """The readiness check and the metrics of a process serving ``app`` on ``url``."""
    from stores.migrate import head_revision
    from stores.monitoring import MonitoringDatabase
    from workers.health import Readiness
    from workers.metrics import Metrics, durable_agents

    database = MonitoringDatabase(url) if _durable(app) else None
    metrics = Metrics(database=database, agents=durable_agents(app), pool=pool)
    if pool is not None:
        metrics.observe_pool(pool)
    readiness = Readiness(
        database=database, head=head_revision() if database is not None else None, pool=pool
    )
    return readiness, metrics


def _health_port(
    args: argparse.Namespace, app: Engine, url: str, pool: WorkerPool
) -> tuple[HealthServer, Readiness]:
    """The worker's ``--health-port`` server (bound now: a port in use is a usage error)."""
    from workers.health import HealthServer, health_app
    from workers.http_limits import ConnectionLimits

    readiness, metrics = _observability(app, url, pool)
    limits = ConnectionLimits(
        max_connections=HEALTH_PORT_CONNECTIONS, max_requests=HEALTH_PORT_CONNECTIONS
    )
    _hold_back_floods()
    try:
        server = HealthServer(
            health_app(readiness, metrics, limits), args.health_host, args.health_port, limits
        )
    except OSError as exc:
        raise _UsageError(
            f"cannot listen on --health-port {args.health_host}:{args.health_port}: {exc}"
        ) from exc
    return server, readiness


async def _serve(
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


def _serve_http(args: argparse.Namespace, url: str) -> int:
    import uvicorn
    from starlette.middleware import Middleware

    from engine.remote import create_app
    from workers.health import health_routes
    from workers.http_limits import BodyDeadline, InFlightLimit
    from workers.metrics import HttpMetrics

    limits = _serve_limits(args)
    os.environ[DATABASE_URL_ENV] = url  # read by the app module at import time
    app = _load_app(args.app)
    _configure_logging(args.log_level)  # before the wait for the database, which it reports
    if _durable(app):
        _check_at_head(url, args.connect_timeout)
    auth = _load_attr(args.auth, "--auth") if args.auth else None
    if auth is not None and not callable(auth):
        raise _UsageError(f"--auth {args.auth} is not callable (an Authenticator).")
    pool: WorkerPool | None = None
    if args.workers > 0:
        try:
            pool = WorkerPool(app, concurrency=args.workers)
        except ValueError as exc:
            raise _UsageError(str(exc)) from exc
    readiness, metrics = _observability(app, url, pool)
    asgi = create_app(
        app,
        auth=auth,
        max_body_bytes=args.max_body_bytes,
        lifespan=_pool_lifespan(pool, readiness),
        routes=health_routes(readiness, metrics),
        middleware=[
            Middleware(HttpMetrics, metrics=metrics),
            Middleware(InFlightLimit, limit=limits.max_requests),
            Middleware(BodyDeadline, seconds=limits.body_timeout),
        ],
    )
    logger.info(
        "serving %s on http://%s:%d (%s, %d worker slot(s); at most %d connections, "
        "%d requests at once)",
        ", ".join(app.agents),
        args.host,
        args.port,
        redact_url(url),
        args.workers,
        limits.max_connections,
        limits.max_requests,
    )
    config = uvicorn.Config(
        asgi,
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        **limits.uvicorn_options(),
    )
    _hold_back_floods()  # after uvicorn.Config, which configures uvicorn's loggers
    try:
        uvicorn.Server(config).run()
    finally:
        if readiness.database is not None:
            readiness.database.dispose()
    return 0


def _serve_limits(args: argparse.Namespace) -> ConnectionLimits:
    """The connection and request limits of ``turnstile serve`` from its flags."""
    from workers.http_limits import ConnectionLimits, default_connection_limit

    connections = args.limit_connections or default_connection_limit()
    requests = args.limit_concurrency or max(1, connections // 2)
    if requests > connections:
        raise _UsageError(
            f"--limit-concurrency {requests} exceeds --limit-connections {connections}: "
            "requests beyond the connections could never arrive, and probes need room."
        )
    return ConnectionLimits(
        max_connections=connections,
        max_requests=requests,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        keep_alive=args.timeout_keep_alive,
        max_header_bytes=args.max_header_bytes,
        backlog=args.backlog,
    )


def _hold_back_floods() -> None:
    """Bound the log lines a flood of bad or refused connections can cause: uvicorn warns
    once per invalid request, asyncio once per failed accept."""
    from workers.http_limits import RateLimitedLog

    for name in ("uvicorn.error", "asyncio"):
        logging.getLogger(name).addFilter(RateLimitedLog())


def _pool_lifespan(pool: WorkerPool | None, readiness: Readiness | None = None) -> Any:
    """Run the embedded worker pool for as long as the server runs (``--workers N``)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        if pool is None:
            yield
            return
        stop = asyncio.Event()
        running = asyncio.create_task(pool.run(stop))
        if readiness is not None:
            readiness.watch(running)
        try:
            yield
        finally:
            stop.set()  # uvicorn stopped taking requests: finish or hand back running turns
            await running

    return lifespan


def _migrate(url: str) -> int:
    migrate = _store_hook("migrate")
    if migrate is None:
        raise _UsageError("this installation has no SQL store to migrate (stores.migrate).")
    try:
        _call(migrate, url)
    except Exception as exc:
        print(f"turnstile migrate: failed on {redact_url(url)}: {exc}", file=sys.stderr)
        return 1
    print(f"database at head: {redact_url(url)}")
    return 0


def _seconds(text: str) -> float:
    """A non-negative number of seconds (an ``argparse`` type)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, not {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    """A number of seconds > 0 (an ``argparse`` type): a timeout of 0 would refuse all."""
    value = _seconds(text)
    if value == 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, not {text!r}")
    return value


def _positive_int(text: str) -> int:
    """An integer >= 1 (an ``argparse`` type)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, not {text!r}")
    return value


def _port(text: str) -> int:
    """A TCP port, 0 to 65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, not {text!r}")
    return value


#: The accepted ``--log-level`` values (any case): a typo is a usage error, not a traceback.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _version() -> str:
    """The installed distribution's version (a source tree that is not installed: unknown)."""
    try:
        return importlib.metadata.version("turnstile")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnstile", description="Turnstile: durable, approval-gated LLM agents."
    )
    parser.add_argument("--version", action="version", version=f"turnstile {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    db_help = f"database URL (default: ${DATABASE_URL_ENV}, else {DEFAULT_DB_URL})"
    connect_help = (
        "seconds to wait at start for a database that cannot be reached yet "
        f"(default: {DEFAULT_CONNECT_TIMEOUT:g}; 0: try once)"
    )

    worker = commands.add_parser("worker", help="run a worker pool for an app's agents")
    worker.add_argument("--app", required=True, help="the app's Engine, as module:attribute")
    worker.add_argument("--db", help=db_help)
    worker.add_argument("--concurrency", type=int, default=4, help="turns run at once")
    worker.add_argument(
        "--observer",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="a PoolObserver told of every turn claimed and finished (repeatable)",
    )
    worker.add_argument("--poll-interval", type=float, default=1.0, help="seconds between polls")
    worker.add_argument(
        "--shutdown-grace", type=float, default=10.0, help="seconds running turns get at stop"
    )
    worker.add_argument(
        "--expiry-interval",
        type=float,
        default=5.0,
        help="seconds between checks for expired approvals",
    )
    worker.add_argument(
        "--retention-days",
        type=float,
        default=None,
        help="delete sessions idle this many days (open approvals are kept); default: keep all",
    )
    worker.add_argument(
        "--connect-timeout", type=_seconds, default=DEFAULT_CONNECT_TIMEOUT, help=connect_help
    )
    worker.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, help="how much to log"
    )
    worker.add_argument(
        "--health-port",
        type=_port,
        default=None,
        help="serve /healthz, /readyz and /metrics on this port (default: none)",
    )
    worker.add_argument(
        "--health-host", default="127.0.0.1", help="interface of --health-port (default: loopback)"
    )

    serve = commands.add_parser(
        "serve", help="serve an app's agents over HTTP (Genkit's protocol + approval inbox)"
    )
    serve.add_argument("--app", required=True, help="the app's Engine, as module:attribute")
    serve.add_argument("--db", help=db_help)
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on")
    serve.add_argument(
        "--workers", type=int, default=0, help="also run a worker pool with N slots in-process"
    )
    serve.add_argument(
        "--auth", help="an Authenticator as module:attribute (default: no authentication)"
    )
    serve.add_argument(
        "--max-body-bytes", type=int, default=1_000_000, help="larger request bodies get 413"
    )
    serve.add_argument(
        "--connect-timeout", type=_seconds, default=DEFAULT_CONNECT_TIMEOUT, help=connect_help
    )
    serve.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, help="how much to log"
    )
    _add_limit_flags(serve)

    migrate = commands.add_parser("migrate", help="bring the database schema to head")
    migrate.add_argument("--db", help=db_help)
    return parser


def _add_limit_flags(serve: argparse.ArgumentParser) -> None:
    """``turnstile serve``'s connection and request limits (docs/configuration.md)."""
    limits = serve.add_argument_group("connection limits")
    limits.add_argument(
        "--limit-connections",
        type=_positive_int,
        default=None,
        help="open connections kept at most; past it the longest-idle one is closed "
        "(default: 1000, or half the open-file limit when lower)",
    )
    limits.add_argument(
        "--limit-concurrency",
        type=_positive_int,
        default=None,
        help="requests served at once; the next get 503 (default: half of --limit-connections; "
        "probes and /metrics are exempt)",
    )
    limits.add_argument(
        "--header-timeout",
        type=_positive_seconds,
        default=10.0,
        help="seconds a connection may take to send a complete request head (default: 10)",
    )
    limits.add_argument(
        "--body-timeout",
        type=_positive_seconds,
        default=30.0,
        help="seconds a request may take to send its whole body; then 408 (default: 30)",
    )
    limits.add_argument(
        "--timeout-keep-alive",
        type=_positive_int,
        default=5,
        help="seconds an idle keep-alive connection is kept (default: 5)",
    )
    limits.add_argument(
        "--max-header-bytes",
        type=_positive_int,
        default=16384,
        help="largest request head accepted; larger get 400 (default: 16384)",
    )
    limits.add_argument(
        "--backlog",
        type=_positive_int,
        default=2048,
        help="connections the kernel queues before they are accepted (default: 2048)",
    )


def main(argv: list[str] | None = None) -> int:
    """Run the ``turnstile`` command line; returns the process exit status."""
    args = _parser().parse_args(argv)
    try:
        url = resolve_db_url(args.db)
        if args.command == "worker":
            return _worker(args, url)
        if args.command == "serve":
            return _serve_http(args, url)
        return _migrate(url)
    except _UsageError as exc:
        print(f"turnstile {args.command}: {exc}", file=sys.stderr)
        return 2
    except _DatabaseUnreachable as exc:
        print(f"turnstile {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
