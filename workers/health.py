"""Health probes and the metrics endpoint: ``/healthz``, ``/readyz``, ``/metrics``.

``turnstile serve`` adds :func:`health_routes` to its app; ``turnstile worker --health-port``
serves the same routes with :class:`HealthServer`, a small uvicorn server in the worker's own
event loop. Serving probes from the loop that runs the turns is deliberate: a loop that no
longer answers its probes is a process to restart.

* ``/healthz`` — the process is alive and its event loop answers; touches nothing else.
* ``/readyz`` — the database is reachable and at the code's migration head, the worker
  pool (when the process runs one) is claiming, and (on ``turnstile serve``) a request slot is
  free. Otherwise 503 with the reason, in JSON.
* ``/metrics`` — Prometheus' text format (:mod:`workers.metrics`).

No probe answers 500: whatever fails is a 503 with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from stores.monitoring import MonitoringDatabase
from workers.http_limits import BodyDeadline, ConnectionLimits, RequestSlots
from workers.metrics import CONTENT_TYPE_LATEST, HttpMetrics, Metrics
from workers.pool import WorkerPool

__all__ = ["HealthServer", "Readiness", "health_app", "health_routes"]

logger = logging.getLogger("turnstile.health")

#: A readiness result is reused for this long: a flood of probes costs one query a second.
READINESS_CACHE_SECONDS = 1.0


class Readiness:
    """Whether this process should get traffic (see the module docstring).

    ``database`` is checked against the ``head`` revision (``None``: the app keeps no turns
    in a database, so there is nothing to check); ``pool``, once :meth:`watch` is given the
    task running it, must be running and not stopping.
    """

    def __init__(
        self,
        *,
        database: MonitoringDatabase | None,
        head: str | None,
        pool: WorkerPool | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.database = database
        self.head = head
        self.pool = pool
        self.timeout = timeout
        self._pool_task: asyncio.Task[Any] | None = None
        self._slots: RequestSlots | None = None
        self._check: asyncio.Future[tuple[str | None, str | None]] | None = None
        self._worker_wait: float | None = None
        self._checked_at = -READINESS_CACHE_SECONDS

    def watch(self, task: asyncio.Task[Any]) -> None:
        """The task that runs the pool: the pool is ready while it runs."""
        self._pool_task = task

    def watch_queue(self, worker_wait: float) -> None:
        """Not ready while a claimable turn has waited longer than ``worker_wait`` seconds
        for a worker: requests for new turns would only be answered 503."""
        self._worker_wait = worker_wait

    def watch_requests(self, slots: RequestSlots) -> None:
        """The server's request slots: it is not ready while every one is busy (a balancer
        then sends the next requests elsewhere)."""
        self._slots = slots

    async def check(self) -> tuple[bool, dict[str, str]]:
        """``(ready, {check: what was found})``; never raises."""
        checks: dict[str, str] = {}
        ready = True
        if self.pool is not None:
            problem = self._pool_problem()
            checks["workers"] = problem or f"running ({self.pool.concurrency} slots)"
            ready = problem is None
        if self.database is not None:
            problem, queue = await self._database_problem()
            checks["database"] = problem or f"at head {self.head}"
            ready = ready and problem is None
            if self._worker_wait is not None and problem is None:
                checks["queue"] = queue or f"no turn waits over {self._worker_wait:g}s for a worker"
                ready = ready and queue is None
        if self._slots is not None:
            problem = self._slots.saturation()
            checks["requests"] = problem or self._slots.describe()
            ready = ready and problem is None
        return ready, checks

    def _pool_problem(self) -> str | None:
        task, pool = self._pool_task, self.pool
        assert pool is not None
        if task is None:
            return "not started"
        if task.done():
            return "stopped"
        if pool.stopping:
            return "stopping"
        return None

    async def _database_problem(self) -> tuple[str | None, str | None]:
        """One check at a time, shared by every probe that arrives while it runs, and reused
        for :data:`READINESS_CACHE_SECONDS`; a check that outlasts ``timeout`` is a 503 (it
        goes on in its thread, and the next probe waits for it instead of starting another)."""
        loop = asyncio.get_running_loop()
        fresh = loop.time() - self._checked_at < READINESS_CACHE_SECONDS
        if self._check is None or (self._check.done() and not fresh):
            self._check = asyncio.ensure_future(asyncio.to_thread(self._probe_database))
            self._check.add_done_callback(self._note_checked)
        try:
            return await asyncio.wait_for(asyncio.shield(self._check), self.timeout)
        except TimeoutError:
            return f"database did not answer within {self.timeout:g}s", None

    def _note_checked(self, _done: asyncio.Future[tuple[str | None, str | None]]) -> None:
        self._checked_at = asyncio.get_running_loop().time()

    def _probe_database(self) -> tuple[str | None, str | None]:
        """``(database problem, queue problem)``, ``None`` where there is none."""
        assert self.database is not None
        try:
            current = self.database.schema_revision()
            if current != self.head:
                state = "empty (never migrated)" if current is None else f"at revision {current}"
                need = f"this code needs {self.head} (run: turnstile migrate)"
                return f"database is {state}; {need}", None
            return None, self._queue_problem()
        except Exception as exc:
            reason = " ".join(str(getattr(exc, "orig", None) or exc).split())
            return f"database unreachable: {reason}", None

    def _queue_problem(self) -> str | None:
        """Which agent's claimable turns have waited longer than the worker wait."""
        if self._worker_wait is None:
            return None
        assert self.database is not None
        now = datetime.now(UTC)
        for agent, gauges in self.database.read_gauges(now).agents.items():
            oldest = gauges.oldest_queued
            if oldest is not None and (now - oldest).total_seconds() > self._worker_wait:
                waited = (now - oldest).total_seconds()
                versions = ", ".join(sorted(v or "(unpinned)" for v in gauges.queued_by_version))
                return (
                    f"{gauges.queued} turn(s) of {agent} wait for a worker, the oldest for "
                    f"{waited:.0f}s; is a worker running for version {versions}?"
                )
        return None


def health_routes(readiness: Readiness, metrics: Metrics | None) -> list[BaseRoute]:
    """``/healthz``, ``/readyz`` and (with ``metrics``) ``/metrics``."""

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_request: Request) -> Response:
        try:
            ready, checks = await readiness.check()
        except Exception as exc:  # a bug here must still not read as a crashed server
            logger.exception("readiness check failed")
            return JSONResponse(
                {"status": "unavailable", "reason": f"readiness check failed: {exc!r}"},
                status_code=503,
            )
        if ready:
            return JSONResponse({"status": "ready", "checks": checks})
        reason = "; ".join(f"{name}: {found}" for name, found in checks.items())
        return JSONResponse(
            {"status": "unavailable", "reason": reason, "checks": checks}, status_code=503
        )

    routes: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET", "HEAD"]),
        Route("/readyz", readyz, methods=["GET", "HEAD"]),
    ]
    if metrics is not None:

        async def metrics_page(_request: Request) -> Response:
            try:
                body = await metrics.render()
            except Exception as exc:
                logger.exception("rendering metrics failed")
                return JSONResponse(
                    {"status": "unavailable", "reason": f"metrics failed: {exc!r}"},
                    status_code=503,
                )
            return Response(body, media_type=CONTENT_TYPE_LATEST)

        routes.append(Route("/metrics", metrics_page, methods=["GET", "HEAD"]))
    return routes


def health_app(
    readiness: Readiness, metrics: Metrics | None, limits: ConnectionLimits
) -> Starlette:
    """The probes and metrics as an app of their own (a worker's health port)."""
    middleware = [Middleware(BodyDeadline, seconds=limits.body_timeout)]
    if metrics is not None:
        middleware.insert(0, Middleware(HttpMetrics, metrics=metrics))
    return Starlette(routes=health_routes(readiness, metrics), middleware=middleware)


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signals to its host: the worker handles SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HealthServer:
    """``app`` on ``host:port`` in the running event loop, for as long as the worker runs.

    The socket is bound at construction, so a port in use is a start-up error, not a
    failure inside the loop.
    """

    def __init__(self, app: Any, host: str, port: int, limits: ConnectionLimits) -> None:
        self.host, self.port = host, port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(limits.backlog)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        config = uvicorn.Config(
            app,
            lifespan="off",
            access_log=False,
            log_config=None,
            log_level="warning",  # the worker logs its own start and stop
            timeout_graceful_shutdown=5,
            **limits.uvicorn_options(),
        )
        self.server = _QuietServer(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def bound_port(self) -> int:
        return int(self.socket.getsockname()[1])

    async def start(self) -> None:
        """Serve in a background task; returns once the server listens."""
        self._task = asyncio.create_task(self.server.serve(sockets=[self.socket]))
        deadline = time.monotonic() + 10
        while not self.server.started and not self._task.done():
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # raises what stopped it
        logger.info("health and metrics on http://%s:%d", self.host, self.bound_port)

    async def stop(self) -> None:
        """Stop serving and wait for the server's task."""
        self.server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        self.socket.close()
