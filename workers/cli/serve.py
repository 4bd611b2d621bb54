"""``turnstile serve --app module:engine``: the app's agents over HTTP (Genkit's protocol and
the approval inbox, :func:`engine.remote.create_app`), with health probes and metrics on the
same port, uvicorn's h11 protocol under the connection limits of :mod:`workers.http_limits`,
and optionally a worker pool in the same process (``--workers N``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from types import FrameType
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
from workers.cli.probes import hold_back_floods, observability
from workers.cli.startup import (
    AppFlags,
    Refused,
    TurnstileCommand,
    check_at_head,
    check_auth,
    configure_process,
    durable,
    load_attr,
    load_checked_app,
    log_models,
)
from workers.pool import WorkerPool

if TYPE_CHECKING:
    from engine import Engine
    from engine.remote.auth import InboxPolicy
    from stores.ui_sessions import SqlBrowserSessions
    from workers.health import Readiness
    from workers.http_limits import ConnectionLimits

__all__ = ["ServeFlags", "run_serve", "serve"]

logger = logging.getLogger("turnstile.cli")

#: Worker slots ``serve --dev`` runs in its own process unless ``--workers`` says otherwise.
DEV_WORKERS = 2


@dataclass(frozen=True)
class ServeFlags(AppFlags):
    """``turnstile serve``'s options, parsed (see ``docs/configuration.md``)."""

    host: str
    port: int
    workers: int | None
    worker_wait: float
    auth: str | None
    inbox_policy: str | None
    max_turns_per_principal: int | None
    max_body_bytes: int
    allowed_hosts: str | None
    forwarded_allow_ips: str | None
    limit_connections: int | None
    limit_concurrency: int | None
    limit_per_client: int | None
    limit_streams: int | None
    header_timeout: float
    body_timeout: float
    timeout_keep_alive: int
    max_header_bytes: int
    backlog: int


def _limit_options(function: Any) -> Any:
    """``turnstile serve``'s connection and request limits (docs/configuration.md)."""
    decorators = [
        option(
            "--limit-connections",
            type=WholeNumber(1),
            default=None,
            help="open connections kept at most; past it the longest-idle one is closed "
            "[default: 1000, or half the open-file limit when lower]",
        ),
        option(
            "--limit-concurrency",
            type=WholeNumber(1),
            default=None,
            help="requests served at once; the next get 503 (probes and /metrics are exempt) "
            "[default: half of --limit-connections]",
        ),
        option(
            "--limit-per-client",
            type=WholeNumber(1),
            default=None,
            help="requests one client address may have in flight; the next get 429 "
            "[default: a quarter of --limit-concurrency]",
        ),
        option(
            "--limit-streams",
            type=WholeNumber(1),
            default=None,
            help="/ui/events streams open at once, outside --limit-concurrency "
            "[default: a quarter of --limit-connections]",
        ),
        option(
            "--header-timeout",
            type=Seconds(positive=True),
            default=10.0,
            help="seconds a connection may take to send a complete request head",
        ),
        option(
            "--body-timeout",
            type=Seconds(positive=True),
            default=30.0,
            help="seconds a request may take to send its whole body; then 408",
        ),
        option(
            "--timeout-keep-alive",
            type=WholeNumber(1),
            default=5,
            help="seconds an idle keep-alive connection is kept",
        ),
        option(
            "--max-header-bytes",
            type=WholeNumber(1),
            default=16384,
            help="largest request head accepted; larger get 400",
        ),
        option(
            "--backlog",
            type=WholeNumber(1),
            default=2048,
            help="connections the kernel queues before they are accepted",
        ),
    ]
    for decorate in reversed(decorators):
        function = decorate(function)
    return function


@click.command("serve", cls=TurnstileCommand)
@app_option
@db_option
@option("--host", default="127.0.0.1", help="interface to listen on")
@option("--port", type=Port(), default=8080, help="port to listen on")
@option(
    "--workers",
    type=WholeNumber(0),
    default=None,
    help="also run a worker pool with this many slots in this process "
    f"[default: 0; {DEV_WORKERS} with --dev]",
)
@option(
    "--worker-wait",
    type=Seconds(),
    default=60.0,
    help="seconds a turn request waits for a worker to claim its turn; then 503, the turn "
    "stays queued (0: wait for ever)",
)
@option("--auth", metavar="MODULE:ATTR", help="an Authenticator [default: none, an open server]")
@option(
    "--inbox-policy",
    metavar="SPEC",
    help="who sees and decides approvals: owner, role:NAME or module:attribute [default: owner]",
)
@option(
    "--max-turns-per-principal",
    type=WholeNumber(1),
    default=None,
    help="turns one principal may have in flight; more get 429 [default: unlimited]",
)
@option("--max-body-bytes", type=WholeNumber(1), default=1_000_000, help="larger bodies get 413")
@option(
    "--allowed-hosts",
    metavar="NAMES",
    default=None,
    help="Host names answered, comma-separated (*, *.example.com); others get 400 "
    "[default: any with --auth, else localhost, 127.0.0.1, ::1]",
)
@option(
    "--forwarded-allow-ips",
    metavar="IPS",
    default=None,
    help="proxies (comma-separated addresses, * for any) whose X-Forwarded-For and "
    "-Proto are believed [default: none]",
)
@connect_timeout_option
@log_options
@retry_options
@pool_size_option("10")
@dev_option
@_limit_options
def serve(**values: Any) -> int:
    """Serve an app's agents over HTTP (Genkit's protocol and the approval inbox)."""
    return run_serve(ServeFlags(**values))


def run_serve(flags: ServeFlags) -> int:
    """Start, run and stop one server process; its exit status."""
    import uvicorn
    from starlette.middleware import Middleware

    from engine.remote import create_app
    from engine.remote.tracing import request_span_middleware
    from workers.health import health_routes
    from workers.http_limits import BodyDeadline, RequestLimits, RequestSlots
    from workers.metrics import HttpMetrics

    settings = configure_process(flags)
    limits = serve_limits(flags)
    # Before the app: a demo authenticator is refused whatever the app's keys or database.
    auth = load_attr(flags.auth, "--auth") if flags.auth else None
    if auth is not None and not callable(auth):
        raise Refused(f"--auth {flags.auth} is not callable (an Authenticator).")
    if auth is not None and flags.auth is not None:
        check_auth(auth, flags.auth, dev=flags.dev)
    app, url, settings = load_checked_app(flags, settings, flags.db_pool_size)
    if durable(app):
        check_at_head(url, flags.connect_timeout)
    inbox_policy = _inbox_policy(flags.inbox_policy)
    worker_slots = embedded_slots(flags, app)
    pool: WorkerPool | None = None
    if worker_slots > 0:
        try:
            pool = WorkerPool(app, concurrency=worker_slots)
        except ValueError as exc:
            raise Refused(str(exc)) from exc
    readiness, metrics = observability(app, url, pool)
    request_slots = RequestSlots(limits)
    readiness.watch_requests(request_slots)
    if pool is None and flags.worker_wait and durable(app):
        readiness.watch_queue(flags.worker_wait)
    sessions = _browser_sessions(app, url)
    asgi = create_app(
        app,
        auth=auth,
        inbox_policy=inbox_policy,
        ui_settings=settings.ui_settings(session_store=sessions),
        max_turns_per_principal=flags.max_turns_per_principal,
        max_body_bytes=flags.max_body_bytes,
        allowed_hosts=_host_names(flags.allowed_hosts),
        worker_wait=flags.worker_wait or None,
        lifespan=_pool_lifespan(pool, readiness, sessions),
        routes=health_routes(readiness, metrics),
        middleware=[
            # First, so a request's span covers everything else and carries its traceparent
            # to the turn it creates (recorded only when tracing is configured).
            request_span_middleware(),
            Middleware(HttpMetrics, metrics=metrics),
            Middleware(RequestLimits, slots=request_slots),
            Middleware(BodyDeadline, seconds=limits.body_timeout, per_path=limits.body_deadlines),
        ],
    )
    log_models(app.agents.values())
    logger.info(
        "serving %s on http://%s:%d (%s, %d worker slot(s); at most %d connections, "
        "%d requests at once)",
        ", ".join(app.agents),
        flags.host,
        flags.port,
        redact(url),
        worker_slots,
        limits.max_connections,
        limits.max_requests,
        extra={"database": redact(url), "concurrency": worker_slots},
    )
    config = uvicorn.Config(
        asgi,
        host=flags.host,
        port=flags.port,
        log_level=flags.log_level.lower(),
        # Its records go through the handler configure_logging installed, in our format.
        log_config=None,
        # X-Forwarded-For names the client the sign-in limits count, so a header anyone can
        # send is believed only from the proxies the operator names.
        proxy_headers=flags.forwarded_allow_ips is not None,
        forwarded_allow_ips=flags.forwarded_allow_ips,
        **limits.uvicorn_options(),
    )
    hold_back_floods()
    # uvicorn re-raises the signal that stopped it once it has shut down; SIGTERM is how an
    # orchestrator asks for a clean stop, so after it the process exits 0, not 143.
    signal.signal(signal.SIGTERM, _stopped_cleanly)
    try:
        graceful_server(config).run()
    finally:
        if readiness.database is not None:
            readiness.database.dispose()
    return 0


def graceful_server(config: Any) -> Any:
    """A uvicorn server that, asked to stop, ends the inbox UI's event streams and answers
    the requests waiting for a worker to take their turn (it waits for open responses, and
    neither would end by itself); a second signal stops it at once."""
    import uvicorn

    from engine.remote.shutdown import begin_shutdown

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # A second signal, whichever, stops at once (uvicorn forces only on SIGINT).
            if self.should_exit:
                self.force_exit = True
            begin_shutdown()
            super().handle_exit(sig, frame)

    return Server(config)


def _inbox_policy(spec: str | None) -> InboxPolicy | None:
    """The ``--inbox-policy`` a spec names (``None``: the server's default, owner)."""
    if spec is None:
        return None
    from engine.remote.auth import inbox_policy_from_spec

    try:
        return inbox_policy_from_spec(spec)
    except ValueError as exc:
        raise Refused(f"--inbox-policy: {exc}") from exc


def embedded_slots(flags: ServeFlags, app: Engine) -> int:
    """The worker slots this server runs itself: ``--workers``, else :data:`DEV_WORKERS`
    with ``--dev`` when the app has turns to queue (a local server answers its own turns and
    decisions), else none."""
    if flags.workers is not None:
        return flags.workers
    if flags.dev and any(agent.queued for agent in app.agents.values()):
        logger.info(
            "--dev: running %d worker slots in this process (--workers 0: none)", DEV_WORKERS
        )
        return DEV_WORKERS
    return 0


def serve_limits(flags: ServeFlags) -> ConnectionLimits:
    """The connection and request limits of ``turnstile serve`` from its flags."""
    from workers.http_limits import ConnectionLimits, default_connection_limit

    connections = flags.limit_connections or default_connection_limit()
    requests = flags.limit_concurrency or max(1, connections // 2)
    if requests > connections:
        raise Refused(
            f"--limit-concurrency {requests} exceeds --limit-connections {connections}: "
            "requests beyond the connections could never arrive, and probes need room."
        )
    if flags.limit_per_client is not None and flags.limit_per_client > requests:
        raise Refused(
            f"--limit-per-client {flags.limit_per_client} exceeds --limit-concurrency "
            f"{requests}: one client could never have that many requests in flight."
        )
    return ConnectionLimits(
        max_connections=connections,
        max_requests=requests,
        max_requests_per_client=flags.limit_per_client,
        max_streams=flags.limit_streams,
        header_timeout=flags.header_timeout,
        body_timeout=flags.body_timeout,
        keep_alive=flags.timeout_keep_alive,
        max_header_bytes=flags.max_header_bytes,
        backlog=flags.backlog,
    )


def _host_names(spec: str | None) -> list[str] | None:
    """``--allowed-hosts``'s names (``None``: the default of ``create_app``)."""
    if spec is None:
        return None
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if not names:
        raise Refused("--allowed-hosts names no host: give names, or * for any.")
    return names


def _browser_sessions(app: Engine, url: str) -> SqlBrowserSessions | None:
    """The web UI's browser sessions in the served database, so every server process shares
    them and the sign-in limits (``None`` for an app with no database: this process's)."""
    from stores.database import Database
    from stores.ui_sessions import SqlBrowserSessions

    if not durable(app):
        return None
    return SqlBrowserSessions(Database(url, pool_size=2))


def _pool_lifespan(
    pool: WorkerPool | None,
    readiness: Readiness | None = None,
    sessions: SqlBrowserSessions | None = None,
) -> Any:
    """Run the embedded worker pool for as long as the server runs (``--workers N``), and
    close the browser sessions' connections when it stops."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        try:
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
        finally:
            if sessions is not None:
                await asyncio.to_thread(sessions.db.dispose)

    return lifespan


def _stopped_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)
