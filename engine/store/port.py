"""The store port: what the engine needs from persistence, as protocols, one per part.

A backend implements :class:`SessionStore`, which unites them all; code that needs one part
names only it (the turn runner a :class:`Journal`, the web pages a :class:`TurnTimeline`...).
The engine talks to stores only through these protocols; the reference implementation is
:class:`engine.store.memory.InMemorySessionStore`, the SQL one ``stores.SqlSessionStore``, and
the contract suite in ``tests/integration/test_store_*.py`` runs unchanged against each.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from engine.conversation.parts import Message
from engine.model import ModelUsage
from engine.store.records import (
    AbortOutcome,
    ApprovalChange,
    ApprovalQuery,
    Assignment,
    AssignmentChange,
    ClaimedTurn,
    DecidedApproval,
    DecisionQuery,
    DueQuery,
    InterruptAnswer,
    Key,
    NewTurn,
    OpenApproval,
    PendingApproval,
    RoundRecord,
    SessionRecord,
    StoredSnapshot,
    TimelineEntry,
    ToolCallRecord,
    Transition,
    TurnProgress,
    TurnQuery,
    TurnRecord,
    TurnRow,
    Vote,
    VoteOutcome,
    WebhookDelivery,
    WebhookSettlement,
)
from engine.store.relay import ChunkSubscription
from engine.store.signals import ChangeSubscription

#: What to write on an open approval, given it as its store read it under its lock; raises a
#: typed error (nothing written) to refuse the change.
ApprovalRule = Callable[[OpenApproval], ApprovalChange]

__all__ = [
    "ApprovalHistory",
    "ApprovalRule",
    "AssignmentBook",
    "ChangeFeed",
    "Inbox",
    "Journal",
    "Relay",
    "Retention",
    "SessionStore",
    "TurnListing",
    "TurnQueue",
    "TurnTimeline",
    "VoteBook",
    "WebhookOutbox",
]


class TurnQueue(Protocol):
    """Turns as a queue of leased work: created ``pending``, claimed under a lease, renewed,
    moved by guarded transitions, aborted; and the wake-ups that tell workers to claim."""

    async def create_turn(
        self, turn: NewTurn, *, answers: Sequence[InterruptAnswer] = ()
    ) -> TurnRecord:
        """Insert a ``pending`` turn (and its session, if new), atomically.

        Also marks each answered call ``answered`` — only if it is still ``interrupted``
        (else :class:`~engine.errors.ApprovalNotPendingError`); answers must name calls of
        the parent turn, each once (else :class:`~engine.errors.InvalidArgumentError`). Raises
        :class:`~engine.errors.SessionBusyError` when the session already has a ``pending`` or
        ``aborting`` turn, and :class:`~engine.errors.InvalidArgumentError` when the session
        belongs to another agent. Nothing is written when it raises.

        A turn with a ``definition_fingerprint`` and a ``definition`` also makes sure the
        definition is kept under that fingerprint (written once; see
        :meth:`read_definition`), before the turn exists.
        """
        ...

    async def create_claimed_turn(
        self,
        turn: NewTurn,
        *,
        answers: Sequence[InterruptAnswer] = (),
        owner: str,
        lease_seconds: float,
    ) -> ClaimedTurn:
        """:meth:`create_turn`, the new turn leased to ``owner`` in the same transaction, for
        a creator that runs the turn itself: its first claim (attempt 1, lease token 1, a
        ``claimed`` history entry after its ``pending`` one), returned with its progress as
        :meth:`claim_turn` returns it.

        No work is announced (no worker is woken to find the turn leased). If the owner
        dies, the lease expires and any worker claims the turn as it claims the turn of a
        worker that died. Refuses, writing nothing, as :meth:`create_turn` does.
        """
        ...

    async def read_definition(self, fingerprint: str) -> dict[str, Any] | None:
        """The agent definition kept under ``fingerprint`` (see :attr:`NewTurn.definition`),
        or ``None`` if no turn was created pinned to it."""
        ...

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None``."""
        ...

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        """The turn, or ``None``."""
        ...

    async def latest_turn(self, session_id: str) -> TurnRecord | None:
        """The session's newest turn (always a leaf), or ``None`` for an unknown session."""
        ...

    async def claim_turn(self, turn_id: str, *, owner: str, lease_seconds: float) -> ClaimedTurn:
        """Lease one specific ``pending`` turn that nobody holds (or whose lease expired)
        and whose ``run_after`` has come; the leased turn comes with its progress (what
        :meth:`Journal.read_progress` returns), read by the claim.

        Increments ``lease_token`` and ``attempts`` and records the claim in the turn's
        history (and the lease it took over, when its previous worker's expired). Raises
        :class:`~engine.errors.StaleTransitionError` if it cannot be claimed.
        """
        ...

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
        """Lease up to ``limit`` claimable turns (oldest ``run_after`` first), each with its
        progress, as :meth:`claim_turn` does; with ``among``, only turns whose id is in it
        (e.g. the ids of :meth:`take_work_hints`); with ``versions``, only turns pinned to
        one of those application versions (turns pinned to none, created before pinning, are
        claimable by any worker)."""
        ...

    async def renew_lease(
        self, turn_id: str, *, lease_token: int, lease_seconds: float
    ) -> TurnRecord:
        """Extend the lease; returns the record (a heartbeat also reads ``aborting``)."""
        ...

    async def transition(self, turn_id: str, change: Transition) -> TurnRecord:
        """Apply ``change`` to the turn (see :class:`Transition`) and record the event.

        Raises :class:`~engine.errors.StaleTransitionError` (or ``LeaseLostError``) on zero
        rows and ``ValueError`` for an edge the state machine does not have.
        """
        ...

    async def request_abort(self, turn_id: str) -> AbortOutcome:
        """Ask a turn to stop; return its status before and after, read and changed under
        one lock.

        ``pending`` and leased → ``aborting`` (its runner settles it); ``pending`` and not
        leased → ``aborted``; otherwise unchanged. Raises
        :class:`~engine.errors.NotFoundError` for an unknown turn.
        """
        ...

    async def wait_for_work(self, timeout: float) -> None:
        """Return when a turn may have become claimable, or after ``timeout`` seconds.

        A wake-up hint only (NOTIFY, or an in-process event): callers re-check by claiming.
        """
        ...

    def take_work_hints(self) -> list[str] | None:
        """The ids of the turns announced claimable since the last call (and forgets them),
        or ``None`` when the store cannot name them all — it has no notifications, or some
        may have been missed (a reconnect, too many to keep).

        A list, even an empty one, is complete: every turn that became claimable since the
        previous call is in it, so claiming ``among`` it finds the new work without scanning
        the queue. ``None`` means only a full :meth:`claim_next` is sure to.
        """
        ...


class Journal(Protocol):
    """What a turn wrote: its rounds, its tool-call journal and its conversation, and the
    reads of them at one moment that a worker and a snapshot need. Its writes are fenced by
    the caller's lease token (see :class:`SessionStore`)."""

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
        """Replace the messages of one round and upsert journal rows, in one transaction.

        ``usage`` (the model call that produced the round, passed only on the save right after
        that call) is added to the turn's ``input_tokens``/``output_tokens`` in the same
        transaction; counts the provider did not report leave the totals unchanged.
        ``earlier``: a preceding round whose write the runner deferred to this one (a round
        that ran nothing), replaced in the same transaction; ``calls`` may include its rows.
        """
        ...

    async def record_call(self, turn_id: str, *, lease_token: int, call: ToolCallRecord) -> None:
        """Upsert one journal row (a call started, finished, failed or interrupted)."""
        ...

    async def load_rounds(self, turn_id: str) -> list[RoundRecord]:
        """Every round the turn saved, committed or not, in round order."""
        ...

    async def list_calls(self, turn_id: str) -> list[ToolCallRecord]:
        """The turn's journal, ordered by round then ref."""
        ...

    async def load_conversation(self, turn_id: str) -> list[Message]:
        """The turn's conversation as of its committed rounds (its snapshot state)."""
        ...

    async def read_progress(self, turn_id: str) -> TurnProgress | None:
        """Everything a worker needs to run (or continue) a turn, read at one moment: its
        parent's conversation and journal, its own rounds and journal (``None`` for an
        unknown turn). One round trip where the store can. A claim returns it already
        (:class:`ClaimedTurn`); this read is for the turns a caller did not claim."""
        ...

    async def read_snapshot(self, turn_id: str) -> StoredSnapshot | None:
        """The turn, its conversation and its journal, read at one moment (``None`` for an
        unknown turn): a turn seen settled comes with everything its settle wrote. What a
        resume reads before it is queued, in one round trip where the store can."""
        ...


class Inbox(Protocol):
    """The approvals waiting for a human: open ones, the decisions recorded ahead of a resume,
    and the ones past their deadline."""

    async def list_approvals(self, query: ApprovalQuery) -> list[PendingApproval]:
        """Open approvals (interrupted, not yet decided, on their session's latest turn),
        ordered by ``(created_at, turn_id, ref)``, filtered and paged by ``query``."""
        ...

    async def list_expired_interrupts(
        self, *, now: datetime, limit: int = 100, agents: Collection[str] | None = None
    ) -> list[ToolCallRecord]:
        """Paused calls past their ``deadline`` that are still ``interrupted``, on turns that
        are their session's latest (``completed``, finish reason ``interrupted``), of
        ``agents`` when given (several apps may share one database)."""
        ...


class Retention(Protocol):
    """Deleting idle sessions with everything they hold, and the lock that keeps a
    maintenance job to one worker of a cluster."""

    def try_cluster_lock(self, name: str) -> AbstractAsyncContextManager[bool]:
        """Hold the cluster-wide lock ``name`` while the block runs, if it is free: yields
        whether it got it, without waiting (a store of one process always gets it)."""
        ...

    async def prune_sessions(self, *, settled_before: datetime, limit: int = 500) -> int:
        """Delete up to ``limit`` sessions idle since ``settled_before`` — no running turn, no
        turn updated since, latest turn not paused at an interrupt (open approvals are kept
        however old) — with all their turns, messages, journal rows and events. Returns how
        many sessions were deleted (retention; run repeatedly until it returns 0)."""
        ...


class Relay(Protocol):
    """What a caller watching a turn receives while it runs elsewhere: its streamed chunks and
    word that its status may have changed."""

    async def publish_chunk(self, turn_id: str, chunk: dict[str, Any]) -> None:
        """Hand one streamed chunk (wire form) to the turn's subscribers, in any process
        sharing the store. Best effort: a chunk nobody receives is simply gone."""
        ...

    def subscribe_chunks(self, turn_id: str) -> AbstractAsyncContextManager[ChunkSubscription]:
        """Receive the chunks published for ``turn_id`` while the block runs."""
        ...

    async def wait_for_change(self, turn_id: str, timeout: float) -> None:
        """Return when the turn's status may have changed, or after ``timeout`` seconds."""
        ...


class VoteBook(Protocol):
    """Open approvals changed under their row's lock: votes, and the decision."""

    async def change_approval(
        self, turn_id: str, round: int, ref: str, rule: ApprovalRule
    ) -> VoteOutcome:
        """Apply ``rule`` to one open approval: lock its journal row, read it with its votes
        and stored assignment (:class:`OpenApproval`), ask ``rule`` what to write
        (:class:`ApprovalChange`) and write it in the same transaction. The rule is the
        engine's (:mod:`engine.approvals.votes`): who may decide, quorum, edit resets and
        assignment checks are decided there, once for every backend; the store only keeps
        the lock, so concurrent changes of one approval run one after the other.

        A recorded decision leaves the call ``interrupted`` (the resume that consumes the
        decisions marks it ``answered``) with ``answer``, ``decided_by`` and ``decided_at``
        set. Raises :class:`~engine.errors.ApprovalNotPendingError` when the approval is not
        open (not ``interrupted``, decided already, or its turn no longer its session's
        latest), and whatever ``rule`` raises; in either case nothing is written.
        """
        ...

    async def list_votes(self, turn_id: str, round: int, ref: str) -> list[Vote]:
        """The votes on one approval, oldest first."""
        ...


class AssignmentBook(Protocol):
    """Who open approvals are assigned to, changed by guarded writes."""

    async def get_assignments(self, keys: Sequence[Key]) -> dict[Key, Assignment]:
        """The stored assignments of these ``(turn_id, round, ref)`` approvals (absent: none
        stored yet)."""
        ...

    async def change_assignment(
        self,
        turn_id: str,
        round: int,
        ref: str,
        change: AssignmentChange,
        *,
        default_group: str | None,
    ) -> Assignment | None:
        """Apply ``change`` to one open approval in one guarded write, starting from
        ``default_group`` when nothing is stored for it yet; the assignment after the change,
        or ``None`` when the change's guard refused it (nothing written).

        Raises :class:`~engine.errors.ApprovalNotPendingError` when the approval is not open.
        """
        ...

    async def list_due_approvals(self, query: DueQuery) -> list[PendingApproval]:
        """Open approvals matching ``query``, oldest first."""
        ...


class ApprovalHistory(Protocol):
    """The decided approvals, newest decision first."""

    async def list_decisions(self, query: DecisionQuery) -> list[DecidedApproval]:
        """Decided interrupts, newest decision first (ties by turn id and ref, descending),
        filtered and keyset-paged by ``query``."""
        ...


class ChangeFeed(Protocol):
    """Telling a subscriber which turns may have changed."""

    @property
    def live_changes(self) -> bool:
        """Whether :meth:`watch_changes` hears changes made by every process (else it hears
        nothing, and callers should poll instead)."""
        ...

    def watch_changes(self) -> AbstractContextManager[ChangeSubscription]:
        """A subscription to the ids of turns created or changed (a status, a vote, an
        assignment) while the block runs. Hints only: callers re-read what they show."""
        ...


class TurnTimeline(Protocol):
    """What happened to a turn, in order (the turn inspector's timeline)."""

    async def timeline(self, turn_id: str) -> list[TimelineEntry]:
        """The turn's append-only history, oldest first (then as appended): status changes,
        claims and lost leases, each attempt's tool call starts and ends, pauses, decisions,
        votes and assignment changes, each with its attempt and actor, in the words of
        :mod:`engine.store.history` (a SQL store's ``turn_timeline`` view)."""
        ...


class WebhookOutbox(Protocol):
    """The durable queue of outgoing webhook deliveries (:mod:`engine.approvals.webhooks`).

    Deliveries reporting a decision, an escalation or a reminder arrive with that change
    (:attr:`ApprovalChange.deliveries`, :attr:`AssignmentChange.deliveries`) and are written
    in its transaction; those announcing an opened approval through :meth:`add_deliveries`.
    Writing a delivery whose ``id`` is kept already writes nothing, so every event is queued
    once per endpoint however often it is written.
    """

    async def add_deliveries(self, deliveries: Sequence[WebhookDelivery]) -> int:
        """Queue these deliveries (a kept ``id`` is skipped); how many were new."""
        ...

    async def opened_watermark(self) -> datetime | None:
        """When the newest approval announced as opened was created (``None``: none yet)."""
        ...

    async def list_unannounced(
        self, interrupts: Collection[tuple[str, str]], *, since: datetime | None, limit: int
    ) -> list[PendingApproval]:
        """Open approvals of these ``(agent, interrupt)`` pairs, created at or after ``since``
        (``None``: any time), with no ``opened`` delivery queued yet, oldest first."""
        ...

    async def claim_deliveries(
        self, *, urls: Collection[str], lease_token: str, lease_seconds: float, limit: int
    ) -> list[WebhookDelivery]:
        """Lease up to ``limit`` pending deliveries to ``urls`` (the endpoints the claimer
        can sign for) that are due and not leased, oldest event first, counting the attempt:
        two claimers never hold one delivery at once (a lease that expired, its worker gone,
        is claimed again)."""
        ...

    async def settle_delivery(self, settlement: WebhookSettlement) -> bool:
        """Record an attempt's outcome and release the lease; ``False`` (nothing written)
        when the lease is no longer ``settlement.lease_token``'s."""
        ...

    async def list_deliveries(
        self, *, turn_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[WebhookDelivery]:
        """Deliveries of one turn and/or in one status, oldest event first."""
        ...


class TurnListing(Protocol):
    """Turns by filter, newest first (``turnstile turns ls`` and the browser's runs page)."""

    async def list_turns(self, query: TurnQuery) -> list[TurnRow]:
        """The turns ``query`` selects, newest first (ties by id, descending), after its
        keyset cursor, each with the open approvals it waits for."""
        ...


@runtime_checkable
class SessionStore(
    TurnQueue,
    Journal,
    Inbox,
    Retention,
    Relay,
    VoteBook,
    AssignmentBook,
    ApprovalHistory,
    ChangeFeed,
    TurnTimeline,
    TurnListing,
    WebhookOutbox,
    Protocol,
):
    """Persistence of sessions, turns, rounds and the tool-call journal, the human side's
    votes, assignments and decided approvals, and the feeds the pages read: every part
    above. A backend implements all of it (docs/architecture.md, "Adding a store backend");
    callers never probe for a part.

    Writes made while a turn runs take the caller's ``lease_token`` and are refused with
    :class:`~engine.errors.LeaseLostError` when it is no longer the turn's (or the turn is no
    longer ``pending``/``aborting``): a worker that lost its lease can write nothing.

    ``durable`` says whether turns outlive this process (a SQL store): a durable store's
    turns are queued for a worker pool rather than run by the caller.
    """

    durable: bool

    async def close(self) -> None:
        """Release connections and listeners."""
        ...
