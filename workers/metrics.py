"""Prometheus metrics of a ``turnstile serve`` or ``turnstile worker`` process.

Little here runs on a turn's path: :class:`EngineMetrics` observes a histogram or bumps a
counter when the engine reports a model or tool call, a lost lease, expired approvals or
relayed chunks (:mod:`engine.telemetry.instruments`). What the database knows (turns in flight, the
queue, open approvals) is read when Prometheus scrapes, by :class:`DatabaseCollector`, one statement
per family (:mod:`stores.monitoring`). The worker pool's counters are numbers the pool keeps anyway,
copied at scrape time. HTTP requests are counted by an ASGI middleware per route template, never per
raw path, so a client cannot grow the number of series.

Every process exposes the database-wide gauges, so they are alike on every target of a job:
aggregate them with ``max``, not ``sum`` (``docs/operations.md``).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage

from engine import Engine
from engine.status import TurnStatus
from engine.store import TurnRecord
from engine.telemetry import instruments
from stores.monitoring import DatabaseGauges, MonitoringDatabase
from workers.pool import WorkerPool

__all__ = [
    "CONTENT_TYPE_LATEST",
    "DatabaseCollector",
    "EngineMetrics",
    "HttpMetrics",
    "Metrics",
    "PoolMetrics",
    "durable_agents",
]

logger = logging.getLogger("turnstile.metrics")

#: HTTP request durations: turn requests wait for their turn, so the buckets reach minutes.
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: Claim latency and turn duration buckets, in seconds.
TURN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
#: Model and tool call durations: a cached tool answers in milliseconds, a long model
#: answer takes minutes.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: Tool outcomes that are not errors.
TOOL_SUCCESSES = frozenset({"done", "interrupted"})
#: Methods counted under their own name; any other is counted as ``other`` (bounded labels).
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: The label of a request no route matched.
UNMATCHED = "unmatched"
#: At most one log line per this many seconds about a failing database scrape.
SCRAPE_FAILURE_LOG_INTERVAL = 60.0


def durable_agents(engine: Engine) -> list[str]:
    """The names of ``engine``'s agents whose turns live in a durable store: the agents the
    database gauges report (with zeros for the ones that have nothing right now)."""
    return sorted(
        name
        for name, agent in engine.agents.items()
        if agent.store is not None and agent.store.durable
    )


def _version() -> str:
    try:
        return importlib.metadata.version("turnstile")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class DatabaseCollector(Collector):
    """The database-wide gauges, read at scrape time (see :mod:`stores.monitoring`).

    ``collect`` blocks on the database: the registry is rendered in a thread. A scrape while
    the database is down still answers, with ``turnstile_database_up 0``.
    """

    def __init__(self, database: MonitoringDatabase, agents: Sequence[str]) -> None:
        self.database = database
        self.agents = list(agents)
        self._last_failure_log = 0.0

    def describe(self) -> Iterable[Metric]:
        return []  # collected live, never at registration

    def collect(self) -> Iterable[Metric]:
        started = time.monotonic()
        up = GaugeMetricFamily(
            "turnstile_database_up", "Whether the last scrape could read the database (1 or 0)."
        )
        try:
            gauges = self.database.read_gauges(datetime.now(UTC))
        except Exception as exc:
            self._log_failure(exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from self._families(gauges)
        took = GaugeMetricFamily(
            "turnstile_database_scrape_seconds",
            "How long the database gauges of this scrape took to read.",
        )
        took.add_metric([], time.monotonic() - started)
        yield took

    def _families(self, gauges: DatabaseGauges) -> Iterable[Metric]:
        turns = GaugeMetricFamily(
            "turnstile_turns",
            "Turns in an active status, by agent and status (settled turns are not counted).",
            labels=["agent", "status"],
        )
        running = GaugeMetricFamily(
            "turnstile_turns_running", "Turns a worker holds a live lease on.", labels=["agent"]
        )
        depth = GaugeMetricFamily(
            "turnstile_queue_depth", "Pending turns a worker could claim now.", labels=["agent"]
        )
        depth_by_version = GaugeMetricFamily(
            "turnstile_queue_depth_by_version",
            "Pending turns a worker could claim now, by the application version they are "
            "pinned to (one no worker serves keeps growing).",
            labels=["agent", "version"],
        )
        queue_age = GaugeMetricFamily(
            "turnstile_queue_oldest_age_seconds",
            "How long the oldest claimable turn has waited (0 when none waits).",
            labels=["agent"],
        )
        approvals = GaugeMetricFamily(
            "turnstile_approvals_open", "Approvals waiting for a decision.", labels=["agent"]
        )
        approval_age = GaugeMetricFamily(
            "turnstile_approvals_oldest_age_seconds",
            "How long the oldest open approval has waited (0 when none waits).",
            labels=["agent"],
        )
        for name in sorted({*self.agents, *gauges.agents}):
            agent = gauges.of(name)
            for status in (TurnStatus.PENDING.value, TurnStatus.ABORTING.value):
                turns.add_metric([name, status], agent.turns.get(status, 0))
            running.add_metric([name], agent.running)
            depth.add_metric([name], agent.queued)
            for version, queued in sorted(agent.queued_by_version.items()):
                depth_by_version.add_metric([name, version], queued)
            queue_age.add_metric([name], _age(gauges.at, agent.oldest_queued))
            approvals.add_metric([name], agent.open_approvals)
            approval_age.add_metric([name], _age(gauges.at, agent.oldest_approval))
        webhooks = GaugeMetricFamily(
            "turnstile_webhook_deliveries_pending",
            "Webhook deliveries waiting to be delivered (due now or retrying later).",
        )
        webhooks.add_metric([], gauges.webhooks_pending)
        yield from (turns, running, depth, depth_by_version, queue_age, approvals, approval_age)
        yield webhooks

    def _log_failure(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._last_failure_log >= SCRAPE_FAILURE_LOG_INTERVAL:
            self._last_failure_log = now
            reason = " ".join(str(getattr(exc, "orig", None) or exc).split())
            logger.warning("metrics: database gauges unavailable (%s)", reason)


def _age(now: datetime, since: datetime | None) -> float:
    return 0.0 if since is None else max(0.0, (now - since).total_seconds())


@dataclass
class _PoolReading:
    """The pool's numbers, copied in the event loop that owns them."""

    slots: int
    busy: int
    claimed: int
    settled: int
    handed_back: int


class _PoolCollector(Collector):
    """The worker pool's slots and counters, from the last :meth:`Metrics.refresh`."""

    def __init__(self) -> None:
        self.reading: _PoolReading | None = None

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        reading = self.reading
        if reading is None:
            return
        slots = GaugeMetricFamily("turnstile_worker_slots", "Turns this process may run at once.")
        slots.add_metric([], reading.slots)
        busy = GaugeMetricFamily("turnstile_worker_slots_busy", "Turns this process runs now.")
        busy.add_metric([], reading.busy)
        claimed = CounterMetricFamily(
            "turnstile_worker_turns_claimed", "Turns this process's pool claimed."
        )
        claimed.add_metric([], reading.claimed)
        settled = CounterMetricFamily(
            "turnstile_worker_turns_settled",
            "Claimed turns this process's pool ran to a settled status.",
        )
        settled.add_metric([], reading.settled)
        handed_back = CounterMetricFamily(
            "turnstile_worker_turns_handed_back",
            "Turns handed back pending at shutdown (their runs were cancelled).",
        )
        handed_back.add_metric([], reading.handed_back)
        yield from (slots, busy, claimed, settled, handed_back)


class PoolMetrics:
    """A :class:`~workers.observers.PoolObserver` keeping the claim latency and turn
    duration histograms and the retry counter."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.claim_latency = Histogram(
            "turnstile_claim_latency_seconds",
            "From when a turn became claimable (its run_after) to its claim.",
            ["agent"],
            buckets=TURN_BUCKETS,
            registry=registry,
        )
        self.turn_duration = Histogram(
            "turnstile_turn_duration_seconds",
            "One attempt of a turn in a worker, from claim to the end of its run, by outcome.",
            ["agent", "status"],
            buckets=TURN_BUCKETS,
            registry=registry,
        )
        self.retries = Counter(
            "turnstile_turn_retries",
            "Attempts that ended in a transient failure and were queued again.",
            ["agent"],
            registry=registry,
        )

    def turn_claimed(self, turn: TurnRecord) -> None:
        waited = (datetime.now(UTC) - turn.run_after).total_seconds()
        self.claim_latency.labels(turn.agent).observe(max(0.0, waited))

    def turn_finished(self, turn: TurnRecord, settled: TurnRecord | None, seconds: float) -> None:
        status = "error" if settled is None else settled.status.value
        self.turn_duration.labels(turn.agent, status).observe(seconds)
        if settled is not None and settled.status is TurnStatus.PENDING:
            self.retries.labels(turn.agent).inc()


class EngineMetrics:
    """An :class:`engine.telemetry.instruments.Instrument` keeping the engine's series: model and
    tool call durations and errors by name, lease losses, expired approvals, relayed chunks.

    A call stopped from outside (an abort, a lost lease, a shutdown) is neither timed nor an
    error: its duration says nothing about the model or the tool.
    """

    def __init__(self, registry: CollectorRegistry, agents: Sequence[str] = ()) -> None:
        self.model_duration = Histogram(
            "turnstile_model_call_duration_seconds",
            "Model calls by agent and model, answered or failed.",
            ["agent", "model"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.model_errors = Counter(
            "turnstile_model_call_errors",
            "Model calls that failed, by kind (transient, or the error's status).",
            ["agent", "model", "kind"],
            registry=registry,
        )
        self.tool_duration = Histogram(
            "turnstile_tool_call_duration_seconds",
            "Tool runs by agent and tool, whatever their outcome.",
            ["agent", "tool"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.tool_errors = Counter(
            "turnstile_tool_call_errors",
            "Tool runs that failed, by outcome (transient, or the error's status).",
            ["agent", "tool", "outcome"],
            registry=registry,
        )
        self.lease_losses = Counter(
            "turnstile_lease_losses",
            "Runs stopped because another worker took over their turn's lease.",
            ["agent"],
            registry=registry,
        )
        self.approvals_expired_total = Counter(
            "turnstile_approvals_expired",
            "Approvals decided by their deadline (a default answer or a failed turn).",
            ["agent"],
            registry=registry,
        )
        self.approval_escalations = Counter(
            "turnstile_approval_escalations",
            "Approvals moved to another group because they stayed open past their timeout.",
            ["agent"],
            registry=registry,
        )
        self.approval_reminders = Counter(
            "turnstile_approval_reminders",
            "Reminders logged about approvals left open past their reminder interval.",
            ["agent"],
            registry=registry,
        )
        self.relay_chunks = Counter(
            "turnstile_relay_chunks",
            "Chunks of running turns this process relayed to streaming clients.",
            registry=registry,
        )
        self.relay_batches = Counter(
            "turnstile_relay_batches",
            "Transactions that carried relayed chunks (each holds one batch).",
            registry=registry,
        )
        self.ui_login_failures = Counter(
            "turnstile_ui_login_failures",
            "Failed sign-ins to the inbox UI: refused by the authenticator, or limited.",
            ["reason"],
            registry=registry,
        )
        self.webhook_deliveries = Counter(
            "turnstile_webhook_deliveries",
            "Attempts at webhook deliveries, by outcome: delivered, retried (failed, tried "
            "again later) or failed (given up after the last attempt).",
            ["outcome"],
            registry=registry,
        )
        # Zeros from the start, so a rate over these counters has a series before the first.
        for reason in ("refused", "limited"):
            self.ui_login_failures.labels(reason)
        for outcome in ("delivered", "retried", "failed"):
            self.webhook_deliveries.labels(outcome)
        for agent in agents:
            self.lease_losses.labels(agent)
            self.approvals_expired_total.labels(agent)
            self.approval_escalations.labels(agent)
            self.approval_reminders.labels(agent)

    def model_call(self, agent: str, model: str, seconds: float, error_kind: str | None) -> None:
        if error_kind == instruments.CANCELLED:
            return
        self.model_duration.labels(agent, model).observe(seconds)
        if error_kind is not None:
            self.model_errors.labels(agent, model, error_kind).inc()

    def tool_call(self, agent: str, tool: str, seconds: float, outcome: str) -> None:
        if outcome == instruments.CANCELLED:
            return
        self.tool_duration.labels(agent, tool).observe(seconds)
        if outcome not in TOOL_SUCCESSES:
            self.tool_errors.labels(agent, tool, outcome).inc()

    def lease_lost(self, agent: str) -> None:
        self.lease_losses.labels(agent).inc()

    def approvals_expired(self, agent: str, count: int) -> None:
        self.approvals_expired_total.labels(agent).inc(count)

    def approval_escalated(self, agent: str) -> None:
        self.approval_escalations.labels(agent).inc()

    def approval_reminded(self, agent: str) -> None:
        self.approval_reminders.labels(agent).inc()

    def chunks_relayed(self, count: int, batches: int) -> None:
        self.relay_chunks.inc(count)
        self.relay_batches.inc(batches)

    def ui_login_failure(self, reason: str) -> None:
        self.ui_login_failures.labels(reason).inc()

    def webhook_delivery(self, outcome: str) -> None:
        self.webhook_deliveries.labels(outcome).inc()


class Metrics:
    """The metrics of one process: its own registry (never the global one, so several apps
    in one interpreter — tests — do not collide), rendered by :meth:`render`."""

    def __init__(
        self,
        *,
        database: MonitoringDatabase | None = None,
        agents: Sequence[str] = (),
        pool: WorkerPool | None = None,
    ) -> None:
        # Counters' *_created series would double the series Prometheus stores, for a
        # start time it can tell from the process's own start.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=False)
        for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(standard)
        info = GaugeMetricFamily(
            "turnstile_build_info", "The running Turnstile's version.", labels=["version"]
        )
        info.add_metric([_version()], 1)
        self.registry.register(_Constant([info]))
        self.http_requests = Counter(
            "turnstile_http_requests",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.http_duration = Histogram(
            "turnstile_http_request_duration_seconds",
            "HTTP request durations by route template (a turn request lasts as its turn).",
            ["route"],
            buckets=HTTP_BUCKETS,
            registry=self.registry,
        )
        self.pool = pool
        self.agents = list(agents)
        self._engine: EngineMetrics | None = None
        self._pool_collector = _PoolCollector()
        if pool is not None:
            self.registry.register(self._pool_collector)
        if database is not None:
            self.registry.register(DatabaseCollector(database, agents))

    def observe_pool(self, pool: WorkerPool) -> PoolMetrics:
        """Attach claim latency, turn duration and retry metrics to ``pool``."""
        observer = PoolMetrics(self.registry)
        pool.add_observer(observer)
        return observer

    def observe_engine(self) -> EngineMetrics:
        """Keep the engine's series (model and tool calls, lease losses, expired approvals,
        relayed chunks) from now until :meth:`close`, or until this object is dropped."""
        if self._engine is None:
            self._engine = EngineMetrics(self.registry, self.agents)
        instruments.add_instrument(self._engine)
        return self._engine

    def close(self) -> None:
        """Stop receiving the engine's reports (the series keep their values)."""
        if self._engine is not None:
            instruments.remove_instrument(self._engine)

    def refresh(self) -> None:
        """Copy the pool's numbers; call in the pool's event loop, before :meth:`render`."""
        pool = self.pool
        if pool is not None:
            self._pool_collector.reading = _PoolReading(
                slots=pool.concurrency,
                busy=len(pool.running),
                claimed=pool.claimed_total,
                settled=pool.settled_total,
                handed_back=pool.handed_back_total,
            )

    async def render(self) -> bytes:
        """The text exposition; the database is read in a thread, not in the event loop."""
        self.refresh()
        return await asyncio.to_thread(generate_latest, self.registry)


class _Constant(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return list(self.families)


def route_template(scope: Scope) -> str:
    """The path template of the route that serves ``scope`` (``/api/{agent}``, convertors
    left out), or :data:`UNMATCHED`: a label with as many values as the app has routes."""
    routes: Sequence[BaseRoute] = getattr(scope.get("app"), "routes", ())
    for route in routes:
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            path = getattr(route, "path", None)
            return _template(path) if isinstance(path, str) else UNMATCHED
    return UNMATCHED


@functools.lru_cache(maxsize=256)
def _template(path: str) -> str:
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


class HttpMetrics:
    """ASGI middleware counting requests by method, route template and status, and timing
    them. Add it to a Starlette app (it reads the app's routes from the scope)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_template(scope)
        method = scope.get("method", "")
        method = method if method in KNOWN_METHODS else "other"
        status = "none"  # the client went away before a response started
        started = time.monotonic()

        async def counted(message: ASGIMessage) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            self.metrics.http_requests.labels(method, route, status).inc()
            self.metrics.http_duration.labels(route).observe(time.monotonic() - started)
