"""Health probes and metrics of a ``turnstile`` process (:mod:`workers.health`,
:mod:`workers.metrics`): what ``serve`` mounts on its port and ``worker --health-port``
serves on its own, and the log filter that bounds what a flood of bad connections logs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine import Engine
from workers.cli.startup import Refused, durable
from workers.pool import WorkerPool

if TYPE_CHECKING:  # imported when used: `turnstile migrate` needs none of them
    from workers.health import HealthServer, Readiness
    from workers.metrics import Metrics

__all__ = ["HEALTH_PORT_CONNECTIONS", "health_server", "hold_back_floods", "observability"]

#: Connections a worker's health port keeps open at most (probes and scrapes need few).
HEALTH_PORT_CONNECTIONS = 64


def observability(app: Engine, url: str, pool: WorkerPool | None) -> tuple[Readiness, Metrics]:
    """The readiness check and the metrics of a process serving ``app`` on ``url``."""
    from stores.migrate import head_revision
    from stores.monitoring import MonitoringDatabase
    from workers.health import Readiness
    from workers.metrics import Metrics, durable_agents

    database = MonitoringDatabase(url) if durable(app) else None
    metrics = Metrics(database=database, agents=durable_agents(app), pool=pool)
    metrics.observe_engine()
    if pool is not None:
        metrics.observe_pool(pool)
    readiness = Readiness(
        database=database, head=head_revision() if database is not None else None, pool=pool
    )
    return readiness, metrics


def health_server(
    app: Engine, url: str, pool: WorkerPool, host: str, port: int
) -> tuple[HealthServer, Readiness]:
    """The worker's ``--health-port`` server (bound now: a port in use is a usage error)."""
    from workers.health import HealthServer, health_app
    from workers.http_limits import ConnectionLimits

    readiness, metrics = observability(app, url, pool)
    limits = ConnectionLimits(
        max_connections=HEALTH_PORT_CONNECTIONS, max_requests=HEALTH_PORT_CONNECTIONS
    )
    hold_back_floods()
    try:
        server = HealthServer(health_app(readiness, metrics, limits), host, port, limits)
    except OSError as exc:
        raise Refused(f"cannot listen on --health-port {host}:{port}: {exc}") from exc
    return server, readiness


def hold_back_floods() -> None:
    """Bound the log lines a flood of bad or refused connections can cause: uvicorn warns
    once per invalid request, asyncio once per failed accept."""
    from workers.http_limits import RateLimitedLog

    for name in ("uvicorn.error", "asyncio"):
        logging.getLogger(name).addFilter(RateLimitedLog())
