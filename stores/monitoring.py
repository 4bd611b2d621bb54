"""The statements behind readiness probes and the database-wide metrics, on a connection of
their own.

Probes and scrapes come every few seconds from outside, and the database may be slow or gone
when they do: they run on a small engine of their own (one pooled connection, a connect
timeout and a statement timeout), so they never wait behind the hot path for a connection,
never hold one of its connections, and always come back within a bound. Every statement reads
only what a partial index or a small table holds — the running turns, the claimable ones, the
open approvals — so its cost follows the work in flight, not the history kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import URL

from engine.status import TurnStatus
from stores.database import normalise_url, utc
from stores.schema import ACTIVE, TIMESTAMP, approval_queue, turns
from stores.webhooks import count_pending

__all__ = ["AgentGauges", "DatabaseGauges", "MonitoringDatabase"]

#: Seconds a probe or scrape may take to connect, and each of its statements to run.
DEFAULT_TIMEOUT = 5.0


@dataclass
class AgentGauges:
    """What the database holds for one agent right now."""

    #: Turns per active status (``pending``, ``aborting``).
    turns: dict[str, int] = field(default_factory=dict)
    #: Turns with a live lease (a worker is running them).
    running: int = 0
    #: Pending turns a worker could claim now, and when the oldest of them became claimable.
    queued: int = 0
    oldest_queued: datetime | None = None
    #: Approvals waiting for a decision, and when the oldest was asked for.
    open_approvals: int = 0
    oldest_approval: datetime | None = None
    #: Claimable pending turns by the application version they are pinned to (``""``:
    #: unpinned): a version that no worker serves shows here as a depth that only grows.
    queued_by_version: dict[str, int] = field(default_factory=dict)


@dataclass
class DatabaseGauges:
    """One scrape's reading of the database, per agent."""

    at: datetime
    agents: dict[str, AgentGauges] = field(default_factory=dict)
    #: Webhook deliveries not yet delivered nor given up (the outbox's backlog).
    webhooks_pending: int = 0

    def of(self, agent: str) -> AgentGauges:
        return self.agents.setdefault(agent, AgentGauges())


# One statement per family. Both use only indexed, bounded sets of rows: turns in an active
# status (the partial unique index ux_turns_one_active_per_session covers them) and the
# undecided rows of approval_queue, which ix_approval_queue_open holds by agent and age: the
# count is an index-only scan that never reads the approvals' payloads.
_NOW = sa.bindparam("now", type_=TIMESTAMP)
#: A pending turn a worker could claim now (the claim's own condition, stores/turn_claims.py).
_CLAIMABLE = sa.and_(
    turns.c.status == TurnStatus.PENDING.value,
    turns.c.run_after <= _NOW,
    sa.or_(turns.c.lease_expires_at.is_(None), turns.c.lease_expires_at < _NOW),
)
_ACTIVE_TURNS = (
    sa.select(
        turns.c.agent,
        turns.c.status,
        turns.c.app_version,
        sa.func.count().label("total"),
        sa.func.sum(sa.case((turns.c.lease_expires_at >= _NOW, 1), else_=0)).label("running"),
        sa.func.sum(sa.case((_CLAIMABLE, 1), else_=0)).label("queued"),
        sa.func.min(sa.case((_CLAIMABLE, turns.c.run_after), else_=None)).label("oldest_queued"),
    )
    .where(turns.c.status.in_(ACTIVE))
    .group_by(turns.c.agent, turns.c.status, turns.c.app_version)
)

_OPEN_APPROVALS = (
    sa.select(
        approval_queue.c.agent,
        sa.func.count().label("total"),
        sa.func.min(approval_queue.c.created_at).label("oldest"),
    )
    .where(approval_queue.c.decided_at.is_(None))
    .group_by(approval_queue.c.agent)
)


class MonitoringDatabase:
    """The database as probes and scrapes see it (see the module docstring).

    Its methods block: call them from a thread (``asyncio.to_thread``) or from a thread
    that may block (a metrics server's).
    """

    def __init__(self, url: str | URL, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = normalise_url(url)
        self.timeout = timeout
        if self.url.get_backend_name() == "postgresql":
            millis = max(1, int(timeout * 1000))
            connect_args: dict[str, object] = {
                "connect_timeout": max(2, int(timeout + 0.999)),  # libpq's minimum is 2 s
                "options": f"-c statement_timeout={millis} -c lock_timeout={millis}",
                "application_name": "turnstile-monitoring",
            }
        else:
            connect_args = {"check_same_thread": False, "timeout": timeout}
        self.engine = sa.create_engine(
            self.url,
            pool_size=1,
            max_overflow=0,
            pool_timeout=timeout,
            # Probes are seconds apart and the database may have restarted in between: a
            # checkout that finds its connection dead opens a new one instead of failing.
            pool_pre_ping=True,
            connect_args=connect_args,
        )

    def schema_revision(self) -> str | None:
        """The Alembic revision the database is at (``None``: never migrated)."""
        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def read_gauges(self, now: datetime) -> DatabaseGauges:
        """Active turns, the claimable queue and open approvals, per agent, as of ``now``."""
        gauges = DatabaseGauges(at=now)
        with self.engine.connect() as connection:
            for row in connection.execute(_ACTIVE_TURNS, {"now": now}):
                agent = gauges.of(row.agent)
                status = str(row.status)
                agent.turns[status] = agent.turns.get(status, 0) + int(row.total)
                agent.running += int(row.running or 0)
                agent.queued += int(row.queued or 0)
                version = row.app_version or ""
                agent.queued_by_version[version] = agent.queued_by_version.get(version, 0) + int(
                    row.queued or 0
                )
                oldest = _moment(row.oldest_queued)
                if oldest is not None and (
                    agent.oldest_queued is None or oldest < agent.oldest_queued
                ):
                    agent.oldest_queued = oldest
            for row in connection.execute(_OPEN_APPROVALS):
                agent = gauges.of(row.agent)
                agent.open_approvals = int(row.total)
                agent.oldest_approval = _moment(row.oldest)
            gauges.webhooks_pending = count_pending(connection)
        return gauges

    def dispose(self) -> None:
        """Close the pooled connection."""
        self.engine.dispose()


def _moment(value: object) -> datetime | None:
    """A timestamp from an aggregate: SQLite may hand back text where a CASE hides the type."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return utc(value)  # type: ignore[no-any-return]
