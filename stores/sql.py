"""``SqlSessionStore``: the durable SessionStore, on PostgreSQL (psycopg 3) or SQLite.

``SqlSessionStore(url)`` returns the class of the URL's database: :class:`PostgresSessionStore`
(``stores/postgres.py``) or :class:`SqliteSessionStore` (``stores/sqlite.py``). Each writes a
turn's common path (create, claim, read, save a round, settle) its own way, once: on
PostgreSQL one statement per write, run on psycopg's async connections in the event loop
(``stores/pg.py``); on SQLite one SQLAlchemy transaction per write, in a worker thread. What
both do the same way — the operators' reads, the inbox, retention, lease renewal and abort
requests, each a short SQLAlchemy transaction — lives here. SQL lives in the aggregate modules
(``turns``, ``turn_claims``, ``turn_creation``, ``fenced``, ``snapshots``, ``sessions``,
``messages``, ``tool_calls``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from engine.conversation.parts import Message
from engine.errors import NotFoundError, StaleTransitionError
from engine.model import ModelUsage
from engine.status import TurnStatus
from engine.store import (
    AbortOutcome,
    ApprovalQuery,
    ApprovalRule,
    Assignment,
    AssignmentChange,
    ClaimedTurn,
    DecidedApproval,
    DecisionQuery,
    DueQuery,
    InterruptAnswer,
    NewTurn,
    PendingApproval,
    RoundRecord,
    SessionRecord,
    StoredSnapshot,
    TimelineEntry,
    ToolCallRecord,
    Transition,
    TurnProgress,
    TurnRecord,
    Vote,
    VoteOutcome,
    WebhookDelivery,
    WebhookSettlement,
)
from engine.store.relay import ChunkBroker, ChunkSubscription
from engine.store.rules import abort_target
from engine.store.signals import ChangeSubscription
from stores import admission as admission_sql
from stores import approvals as approval_sql
from stores import assignments as assignment_sql
from stores import definitions as definition_sql
from stores import messages as message_sql
from stores import operations, views
from stores import retention as retention_sql
from stores import sessions as session_sql
from stores import tool_calls as call_sql
from stores import turn_claims as claim_sql
from stores import turn_versions as version_sql
from stores import turns as turn_sql
from stores import webhooks as webhook_sql
from stores.database import Database, default_url, normalise_url, redact
from stores.schema_check import SchemaCheck
from stores.settings import DEFAULT_POOL_SIZE, current_settings

__all__ = ["DEFAULT_POOL_SIZE", "POOL_SIZE_ENV", "SqlSessionStore", "default_pool_size"]

T = TypeVar("T")

#: The environment variable holding the default ``pool_size`` (``turnstile worker`` sets it).
POOL_SIZE_ENV = "TURNSTILE_DB_POOL_SIZE"


def default_pool_size() -> int:
    """The settings' pool size: ``TURNSTILE_DB_POOL_SIZE`` (``--db-pool-size`` or the
    worker's own under ``turnstile worker``) when set, else :data:`DEFAULT_POOL_SIZE` (10);
    a bad value raises :class:`~stores.settings.InvalidSettingsError` naming the variable."""
    return current_settings().db_pool_size


def now_utc() -> datetime:
    """The time every store write is stamped with."""
    return datetime.now(UTC)


def round_and_transition_times() -> tuple[datetime, datetime]:
    """When a settle's round is saved, and when its transition happens: the round is stamped
    just before the transition, as if saved by save_round first, so a turn's timeline keeps
    ending with its settling transition."""
    saved_at = now_utc()
    return saved_at, max(now_utc(), saved_at + timedelta(microseconds=1))


@dataclass(frozen=True)
class FencedWrite:
    """A lease holder's journal write: a round (and ``earlier``, a round the runner deferred
    to it), journal rows and token usage, kept only while ``lease_token`` holds the running
    turn."""

    turn_id: str
    lease_token: int
    round: RoundRecord | None
    calls: Sequence[ToolCallRecord]
    usage: ModelUsage | None
    earlier: RoundRecord | None = None


class SqlSessionStore:
    """A :class:`~engine.store.SessionStore` in PostgreSQL or SQLite.

    ``SqlSessionStore(url)`` makes the store of the URL's database (see the module doc).
    ``url`` defaults to ``TURNSTILE_DATABASE_URL``, else ``sqlite:///.turnstile/turnstile.db``;
    ``pool_size`` (PostgreSQL) to ``TURNSTILE_DB_POOL_SIZE``, else 10. The schema must exist:
    run ``turnstile migrate`` (or ``alembic upgrade head``).
    ``poll_interval`` bounds how long a missed notification can delay a waiter (SQLite has
    no notifications, so waiters poll at this interval there). ``planner_settings``
    (PostgreSQL): server settings for the hot path's connections; by default
    :data:`stores.pg.PLANNER_SETTINGS`, ``{}`` (or ``TURNSTILE_PG_PLANNER=off``) for none.
    """

    durable = True

    def __new__(cls, url: str | URL | None = None, **options: object) -> SqlSessionStore:
        # Only the URL picks the class; the options are __init__'s, which mypy checks calls against.
        if cls is SqlSessionStore:
            cls = _dialect_class(normalise_url(url or default_url()))
        return super().__new__(cls)

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        pool_size: int | None = None,
        poll_interval: float = 0.05,
        planner_settings: Mapping[str, str] | None = None,
    ) -> None:
        self.db = Database(
            url or default_url(),
            pool_size=pool_size if pool_size is not None else default_pool_size(),
            planner_settings=(
                planner_settings
                if planner_settings is not None
                else self._default_planner_settings()
            ),
        )
        self.poll_interval = poll_interval
        self._chunks = ChunkBroker()
        #: Fingerprints this store has written to ``agent_definitions`` (or found there).
        self._kept_definitions: set[str] = set()
        # A statement meeting a schema older than the code says so, naming turnstile migrate.
        self.db.explain_error = SchemaCheck(self.db.url)
        if self.db.pg is not None:
            self.db.pg.explain_error = self.db.explain_error
        self._start()

    def _default_planner_settings(self) -> Mapping[str, str] | None:
        """The hot path's server settings when the caller names none (only PostgreSQL's
        store has any)."""
        return None

    def _start(self) -> None:
        """Set up what the dialect's store keeps beside its database, once the database is
        open (nothing by default): the last step of ``__init__``, so dialects restate none
        of its options."""

    @property
    def url(self) -> URL:
        """The database URL."""
        return self.db.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact(self.db.url)!r})"

    # -- what each database does its own way (each dialect class defines all of these) --

    async def create_turn(
        self, turn: NewTurn, *, answers: Sequence[InterruptAnswer] = ()
    ) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.create_turn`."""
        raise NotImplementedError

    async def create_claimed_turn(
        self,
        turn: NewTurn,
        *,
        answers: Sequence[InterruptAnswer] = (),
        owner: str,
        lease_seconds: float,
    ) -> ClaimedTurn:
        """See :meth:`engine.store.SessionStore.create_claimed_turn`."""
        raise NotImplementedError

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        """See :meth:`engine.store.SessionStore.get_turn`."""
        raise NotImplementedError

    async def _claim(self, request: claim_sql.ClaimRequest) -> list[ClaimedTurn]:
        """Lease the claimable turns ``request`` asks for (oldest ``run_after`` first)."""
        raise NotImplementedError

    async def transition(self, turn_id: str, change: Transition) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.transition`."""
        raise NotImplementedError

    async def _save_fenced(self, write: FencedWrite) -> None:
        """Save ``write`` only while its lease token holds the running turn (else raise the
        fence's error)."""
        raise NotImplementedError

    async def read_progress(self, turn_id: str) -> TurnProgress | None:
        """See :meth:`engine.store.SessionStore.read_progress`."""
        raise NotImplementedError

    async def read_snapshot(self, turn_id: str) -> StoredSnapshot | None:
        """See :meth:`engine.store.SessionStore.read_snapshot`."""
        raise NotImplementedError

    async def wait_for_work(self, timeout: float) -> None:
        """See :meth:`engine.store.SessionStore.wait_for_work`."""
        raise NotImplementedError

    def take_work_hints(self) -> list[str] | None:
        """See :meth:`engine.store.SessionStore.take_work_hints`."""
        raise NotImplementedError

    async def wait_for_change(self, turn_id: str, timeout: float) -> None:
        """See :meth:`engine.store.SessionStore.wait_for_change`."""
        raise NotImplementedError

    async def publish_chunk(self, turn_id: str, chunk: dict[str, Any]) -> None:
        """See :meth:`engine.store.SessionStore.publish_chunk`."""
        raise NotImplementedError

    def try_cluster_lock(self, name: str) -> AbstractAsyncContextManager[bool]:
        """Hold a cluster-wide lock named ``name`` while the block runs, if it is free
        (yields whether it got it, without waiting)."""
        raise NotImplementedError

    # -- turns -------------------------------------------------------------------------

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """See :meth:`engine.store.SessionStore.get_session`."""
        return await self._read(lambda c: session_sql.get_session(c, session_id))

    async def latest_turn(self, session_id: str) -> TurnRecord | None:
        """See :meth:`engine.store.SessionStore.latest_turn`."""
        return await self._read(lambda c: turn_sql.latest_turn(c, session_id))

    async def claim_turn(self, turn_id: str, *, owner: str, lease_seconds: float) -> ClaimedTurn:
        """See :meth:`engine.store.SessionStore.claim_turn`."""
        claimed = await self._claim(
            claim_sql.ClaimRequest(
                owner=owner, lease_seconds=lease_seconds, now=now_utc(), limit=1, turn_ids=[turn_id]
            )
        )
        if not claimed:
            raise StaleTransitionError(turn_id, f"Turn {turn_id} is not claimable.")
        return claimed[0]

    async def claim_next(
        self,
        *,
        owner: str,
        lease_seconds: float,
        limit: int = 1,
        agents: Collection[str] | None = None,
        among: Collection[str] | None = None,
        versions: Collection[str] | None = None,
    ) -> list[ClaimedTurn]:
        """See :meth:`engine.store.SessionStore.claim_next`."""
        if limit < 1:
            raise ValueError("limit must be at least 1.")
        if among is not None and not among:
            return []
        return await self._claim(
            claim_sql.ClaimRequest(
                owner=owner,
                lease_seconds=lease_seconds,
                now=now_utc(),
                limit=limit,
                agents=agents,
                turn_ids=among,
                versions=versions,
            )
        )

    async def renew_lease(
        self, turn_id: str, *, lease_token: int, lease_seconds: float
    ) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.renew_lease`."""
        return await self._write(
            lambda c: turn_sql.renew(c, turn_id, lease_token, lease_seconds, now_utc())
        )

    async def request_abort(self, turn_id: str) -> AbortOutcome:
        """See :meth:`engine.store.SessionStore.request_abort`."""

        def abort(connection: sa.Connection) -> AbortOutcome:
            # Decided on the locked row: a claim or a settle committing meanwhile would
            # otherwise turn "not leased" into "aborted under a worker", or make the guarded
            # move below match nothing.
            current = turn_sql.lock_turn(connection, turn_id)
            now = now_utc()
            if current is None:
                raise NotFoundError(f"Snapshot {turn_id} not found.")
            target = abort_target(current, now)
            if target is None:
                return AbortOutcome(previous=current.status, status=current.status)
            new, finish_reason = target
            change = Transition(
                expected={TurnStatus.PENDING},
                new=new,
                lease_token=None,
                finish_reason=finish_reason,
                note="abort requested",
            )
            moved = turn_sql.transition(connection, turn_id, change, now)
            return AbortOutcome(previous=current.status, status=moved.status)

        return await self._write(abort)

    # -- rounds and journal ------------------------------------------------------------

    async def save_round(
        self,
        turn_id: str,
        *,
        lease_token: int,
        round: RoundRecord,
        calls: Sequence[ToolCallRecord] = (),
        usage: ModelUsage | None = None,
        earlier: RoundRecord | None = None,
    ) -> None:
        """See :meth:`engine.store.SessionStore.save_round`."""
        await self._save_fenced(
            FencedWrite(
                turn_id, lease_token, round=round, calls=calls, usage=usage, earlier=earlier
            )
        )

    async def record_call(self, turn_id: str, *, lease_token: int, call: ToolCallRecord) -> None:
        """See :meth:`engine.store.SessionStore.record_call`."""
        await self._save_fenced(
            FencedWrite(turn_id, lease_token, round=None, calls=[call], usage=None)
        )

    async def load_rounds(self, turn_id: str) -> list[RoundRecord]:
        """See :meth:`engine.store.SessionStore.load_rounds`."""
        return await self._read(lambda c: message_sql.load_rounds(c, turn_id))

    async def list_calls(self, turn_id: str) -> list[ToolCallRecord]:
        """See :meth:`engine.store.SessionStore.list_calls`."""
        return await self._read(lambda c: call_sql.list_calls(c, turn_id))

    async def load_conversation(self, turn_id: str) -> list[Message]:
        """See :meth:`engine.store.SessionStore.load_conversation`."""

        def load(connection: sa.Connection) -> list[Message]:
            conversation = message_sql.load_conversation(connection, turn_id)
            if conversation is None:
                raise NotFoundError(f"Snapshot {turn_id} not found.")
            return conversation

        return await self._read(load)

    async def list_expired_interrupts(
        self, *, now: datetime, limit: int = 100, agents: Collection[str] | None = None
    ) -> list[ToolCallRecord]:
        """See :meth:`engine.store.SessionStore.list_expired_interrupts`."""
        return await self._read(lambda c: call_sql.list_expired(c, now, limit, agents))

    # -- operator views ----------------------------------------------------------------

    # -- agent definitions (stores/definitions.py) ---------------------------------------

    async def _keep_definition(self, turn: NewTurn) -> None:
        """Write the turn's definition under its fingerprint, the first time this store
        creates a turn pinned to it: the turn's own statement then carries only the
        fingerprint."""
        fingerprint = turn.definition_fingerprint
        if fingerprint is None or turn.definition is None or fingerprint in self._kept_definitions:
            return
        definition = turn.definition
        await self._write(
            lambda c: definition_sql.save_definition(
                c, fingerprint=fingerprint, agent=turn.agent, definition=definition, now=now_utc()
            )
        )
        self._kept_definitions.add(fingerprint)

    async def read_definition(self, fingerprint: str) -> dict[str, Any] | None:
        """See :meth:`engine.store.SessionStore.read_definition`."""
        return await self._read(lambda c: definition_sql.read_definition(c, fingerprint))

    async def stuck_turns(self) -> list[views.StuckTurn]:
        """Rows of the ``stuck_turns`` view."""
        return await self._read(views.stuck_turns)

    async def timeline(self, turn_id: str) -> list[TimelineEntry]:
        """Rows of the ``turn_timeline`` view for one turn, in order."""
        return await self._read(lambda c: views.timeline(c, turn_id))

    # -- versions (turnstile turns migrate; stores/turn_versions.py) ---------------------

    async def list_version_waiting(
        self, version: str, *, agents: Collection[str] | None = None, limit: int = 10_000
    ) -> list[TurnRecord]:
        """The paused and queued turns pinned to ``version``, oldest first."""
        return await self._read(
            lambda c: version_sql.list_waiting(
                c, version=version, agents=agents, now=now_utc(), limit=limit
            )
        )

    async def move_version(
        self,
        turns: Sequence[TurnRecord],
        *,
        from_version: str,
        moves: Mapping[str, version_sql.VersionMove],
        note: str,
    ) -> list[str]:
        """Re-pin ``turns`` (still waiting under ``from_version``) to their agent's entry in
        ``moves``, recording the move on each; the ids moved, in one transaction."""
        return await self._write(
            lambda c: version_sql.move_waiting(
                c, turns, from_version=from_version, moves=moves, note=note, now=now_utc()
            )
        )

    # -- operators' reads (turnstile turns, turnstile stats; stores/operations.py) ---------

    async def list_turns(self, query: operations.TurnQuery) -> list[operations.TurnRow]:
        """The turns ``query`` selects, newest first."""
        return await self._read(lambda c: operations.list_turns(c, query))

    async def turn_detail(self, turn_id: str) -> operations.TurnDetail | None:
        """One turn with its conversation, rounds, journal and children (``None``: unknown)."""
        return await self._read(lambda c: operations.turn_detail(c, turn_id))

    async def read_stats(self, *, exact: bool = False) -> operations.Stats:
        """Counts by status, the queue, the oldest pending turn and open approvals by age;
        on PostgreSQL the settled statuses estimated unless ``exact``."""
        return await self._read(lambda c: operations.read_stats(c, now_utc(), exact=exact))

    async def ids_starting(self, kind: str, prefix: str, *, limit: int) -> list[str]:
        """Ids of ``kind`` (``turn``, ``session``, ``browser session``) starting with
        ``prefix``, at most ``limit`` (an exact match first)."""
        return await self._read(lambda c: operations.ids_starting(c, kind, prefix, limit))

    async def approval_keys_starting(
        self, turn_prefix: str, ref: str | None, *, limit: int
    ) -> list[tuple[str, str]]:
        """``(turn_id, ref)`` of journaled interrupts of turns starting with ``turn_prefix``
        (of ref ``ref`` when given), at most ``limit`` (an exact turn id first)."""
        return await self._read(
            lambda c: operations.approval_keys_starting(c, turn_prefix, ref, limit)
        )

    async def id_prefixes(self, kind: str, ids: list[str], *, shortest: int) -> dict[str, str]:
        """Each of ``ids``' shortest unique prefix of at least ``shortest`` characters."""
        return await self._read(lambda c: operations.id_prefixes(c, kind, ids, shortest))

    # -- inbox and retention -----------------------------------------------------------

    async def active_turn_ids(self, owner: str | None, *, limit: int) -> list[str]:
        """Ids of at most ``limit`` pending or aborting turns of ``owner``'s sessions
        (``None``: sessions without an owner); see :mod:`stores.admission`."""
        return await self._read(lambda c: admission_sql.active_turn_ids(c, owner, limit))

    async def list_approvals(self, query: ApprovalQuery) -> list[PendingApproval]:
        """See :meth:`engine.store.SessionStore.list_approvals`."""
        return await self._read(lambda c: approval_sql.list_approvals(c, query))

    async def list_decisions(self, query: DecisionQuery) -> list[DecidedApproval]:
        """See :meth:`engine.store.ApprovalHistory.list_decisions`."""
        return await self._read(lambda c: approval_sql.list_decisions(c, query))

    async def change_approval(
        self, turn_id: str, round: int, ref: str, rule: ApprovalRule
    ) -> VoteOutcome:
        """See :meth:`engine.store.VoteBook.change_approval`."""
        now = now_utc()
        return await self._write(
            lambda c: approval_sql.change_approval(c, turn_id, round, ref, rule, now)
        )

    async def list_votes(self, turn_id: str, round: int, ref: str) -> list[Vote]:
        """See :meth:`engine.store.VoteBook.list_votes`."""
        return await self._read(lambda c: approval_sql.list_votes(c, turn_id, round, ref))

    async def get_assignments(
        self, keys: Sequence[tuple[str, int, str]]
    ) -> dict[tuple[str, int, str], Assignment]:
        """See :meth:`engine.store.AssignmentBook.get_assignments`."""
        return await self._read(lambda c: assignment_sql.get_assignments(c, keys))

    async def change_assignment(
        self,
        turn_id: str,
        round: int,
        ref: str,
        change: AssignmentChange,
        *,
        default_group: str | None,
    ) -> Assignment | None:
        """See :meth:`engine.store.AssignmentBook.change_assignment`."""
        return await self._write(
            lambda c: assignment_sql.change_assignment(
                c, turn_id, round, ref, change, default_group=default_group, now=now_utc()
            )
        )

    async def list_due_approvals(self, query: DueQuery) -> list[PendingApproval]:
        """See :meth:`engine.store.AssignmentBook.list_due_approvals`."""
        return await self._read(lambda c: assignment_sql.list_due_approvals(c, query))

    # -- webhook outbox ----------------------------------------------------------------

    async def add_deliveries(self, deliveries: Sequence[WebhookDelivery]) -> int:
        """See :meth:`engine.store.WebhookOutbox.add_deliveries`."""
        return await self._write(lambda c: webhook_sql.add_deliveries(c, deliveries))

    async def opened_watermark(self) -> datetime | None:
        """See :meth:`engine.store.WebhookOutbox.opened_watermark`."""
        return await self._read(webhook_sql.opened_watermark)

    async def list_unannounced(
        self, interrupts: Collection[tuple[str, str]], *, since: datetime | None, limit: int
    ) -> list[PendingApproval]:
        """See :meth:`engine.store.WebhookOutbox.list_unannounced`."""
        return await self._read(lambda c: webhook_sql.list_unannounced(c, interrupts, since, limit))

    async def claim_deliveries(
        self, *, urls: Collection[str], lease_token: str, lease_seconds: float, limit: int
    ) -> list[WebhookDelivery]:
        """See :meth:`engine.store.WebhookOutbox.claim_deliveries`."""
        now = now_utc()
        return await self._write(
            lambda c: webhook_sql.claim_deliveries(
                c,
                urls=urls,
                lease_token=lease_token,
                lease_seconds=lease_seconds,
                limit=limit,
                now=now,
            )
        )

    async def settle_delivery(self, settlement: WebhookSettlement) -> bool:
        """See :meth:`engine.store.WebhookOutbox.settle_delivery`."""
        return await self._write(lambda c: webhook_sql.settle_delivery(c, settlement))

    async def list_deliveries(
        self, *, turn_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[WebhookDelivery]:
        """See :meth:`engine.store.WebhookOutbox.list_deliveries`."""
        return await self._read(
            lambda c: webhook_sql.list_deliveries(c, turn_id=turn_id, status=status, limit=limit)
        )

    async def prune_sessions(self, *, settled_before: datetime, limit: int = 500) -> int:
        """See :meth:`engine.store.SessionStore.prune_sessions`."""
        return await self._write(
            lambda c: retention_sql.prune_sessions(c, settled_before=settled_before, limit=limit)
        )

    # -- relay -------------------------------------------------------------------------

    def subscribe_chunks(self, turn_id: str) -> AbstractAsyncContextManager[ChunkSubscription]:
        """See :meth:`engine.store.SessionStore.subscribe_chunks`."""
        return self._subscribe(turn_id)

    @contextlib.asynccontextmanager
    async def _subscribe(self, turn_id: str) -> AsyncIterator[ChunkSubscription]:
        async with self._chunks.subscribe(turn_id) as subscription:
            yield subscription

    async def close(self) -> None:
        """See :meth:`engine.store.SessionStore.close`."""
        await asyncio.to_thread(self.db.dispose)

    # -- the change feed: each dialect's store says how it hears changes ------------------

    #: Whether :meth:`watch_changes` hears the changes of every process.
    live_changes: bool

    def watch_changes(self) -> AbstractContextManager[ChangeSubscription]:
        """See :meth:`engine.store.ChangeFeed.watch_changes` (each dialect's store
        implements it)."""
        raise NotImplementedError

    # -- plumbing ----------------------------------------------------------------------

    async def _read(self, query: Callable[[sa.Connection], T]) -> T:
        return await self.db.read(query)

    async def _write(self, change: Callable[[sa.Connection], T]) -> T:
        return await self.db.write(change)


def _dialect_class(url: URL) -> type[SqlSessionStore]:
    """The store class of ``url``'s database."""
    # Imported here: each dialect module subclasses this one.
    if make_url(url).get_backend_name() == "postgresql":
        from stores.postgres import PostgresSessionStore

        return PostgresSessionStore
    from stores.sqlite import SqliteSessionStore

    return SqliteSessionStore
