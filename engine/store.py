"""The SessionStore protocol: what the engine needs from persistence, and its records.

The granularity is the durable store's: a turn record with a status moved only by guarded
transitions (fenced by a lease token), the conversation saved per round, and a journal row per
tool call. The protocol unites five parts (:class:`TurnQueue`, :class:`Journal`,
:class:`Inbox`, :class:`Retention`, :class:`Relay`), so code that needs one names only it.
The engine talks to stores only through this protocol; implementations live in
:mod:`stores` (``InMemorySessionStore``, ``SqlSessionStore``), and a contract test suite runs
unchanged against each of them.

How a turn's conversation is assembled: a turn keeps the first ``history_length`` messages of
its parent's conversation, then appends the messages of its own *committed* rounds in round
order. Round 0 holds the turn's input (the user message, or for a resume the amended paused
model message and the tool message answering it); round *r* ≥ 1 holds the model message of the
r-th model call and, once its tools finished, the tool message. A round is saved uncommitted
while its tools run (so a recovered worker never asks the model again for it) and committed
once closed, or once it paused at interrupts. A failed or aborted turn therefore holds the
conversation up to its last committed round, never a dangling tool request.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field, model_validator

from engine.model import ModelUsage
from engine.parts import Message, Part
from engine.relay import ChunkSubscription
from engine.session_state import SessionData
from engine.status import FinishReason, TurnStatus

if TYPE_CHECKING:
    from engine.assignment_guard import Assignment

__all__ = [
    "AbortOutcome",
    "ApprovalQuery",
    "FollowOnClaim",
    "Inbox",
    "InterruptAnswer",
    "Journal",
    "NewTurn",
    "PendingApproval",
    "Relay",
    "Retention",
    "RoundRecord",
    "SessionRecord",
    "SessionStore",
    "StoredSnapshot",
    "ToolCallRecord",
    "ToolCallStatus",
    "Transition",
    "TurnError",
    "TurnEvent",
    "TurnInput",
    "TurnProgress",
    "TurnQueue",
    "TurnRecord",
]


class TurnInput(BaseModel):
    """What started a turn: a user message, a resume, a bare retry (``send()``), or a
    ``restore`` — a settled snapshot rebuilt from a verified client-managed state blob, or
    ``expire`` — an approval timed out with no default answer, so the turn fails, or
    ``fork`` — the first turn of a new session, opening with another turn's conversation up to
    one of its completed rounds (:mod:`engine.fork`)."""

    kind: Literal["message", "resume", "retry", "restore", "expire", "fork"]
    message: Message | None = None
    respond: list[Part] = Field(default_factory=list)
    restart: list[Part] = Field(default_factory=list)
    #: For ``expire``: why the paused turn is being failed (shown as the turn's error).
    reason: str | None = None
    #: For ``fork``: the turn whose conversation the new session starts from, and the round
    #: of that turn it was copied up to.
    forked_from: str | None = None
    fork_round: int | None = None
    #: A caller is streaming this turn: whoever runs it publishes its chunks through the
    #: store (:meth:`SessionStore.publish_chunk`). Off by default, so unwatched turns cost
    #: nothing extra.
    relay: bool = False
    #: For a ``resume`` a registered migration adjusted (:mod:`engine.versioning`): the
    #: paused message as the migration rewrote it (answered instead of the parent's last
    #: message), and the version the paused turn was pinned to.
    paused: Message | None = None
    migrated_from: str | None = None


class TurnError(BaseModel):
    """The error a failed turn recorded: ``{status, message, details?}`` as Genkit's."""

    status: str
    message: str
    details: Any = None


class SessionRecord(BaseModel):
    """A conversation: a chain (or tree) of turns of one agent."""

    id: str
    agent: str
    owner: str | None = None
    created_at: datetime
    updated_at: datetime


class NewTurn(BaseModel):
    """A turn about to be created ``pending``.

    ``initial_messages`` are written as the committed round 0 in the same transaction (the
    user message), so the snapshot holds it even if the turn is aborted before it runs.
    """

    id: str
    session_id: str
    agent: str
    parent_id: str | None = None
    #: The session's latest turn when the request was checked: the turn is created only
    #: while it still is (a compare-and-set on the session's head, so no concurrent send is
    #: left off the conversation). The parent, unless the turn continues from before a tail
    #: of failed or aborted turns (then the newest of them), or opens a new session as a
    #: branch of another's snapshot (then ``None``). Defaults to ``parent_id``.
    expected_latest_id: str | None = None
    input: TurnInput
    history_length: int = 0
    initial_messages: list[Message] = Field(default_factory=list)
    owner: str | None = None
    max_attempts: int = 1
    #: The W3C trace context (``traceparent``, ``tracestate``) of the request that created
    #: the turn, so the spans of whoever runs it join that trace; ``None`` outside a trace.
    trace_context: dict[str, str] | None = None
    #: The session's custom state and artifacts the turn starts from (its parent's, or a
    #: client's verified blob); the turn's committed rounds change them.
    custom: Any = None
    artifacts: list[Any] | None = None
    #: The application version whose workers may run the turn, and the fingerprint and
    #: description of the agent definition it is pinned to (:mod:`engine.versioning`). The
    #: turn records the fingerprint; the store keeps the description once per fingerprint
    #: (:meth:`TurnQueue.read_definition`).
    app_version: str | None = None
    definition_fingerprint: str | None = None
    definition: dict[str, Any] | None = None
    #: The note of the turn's first event (e.g. that a migration moved it to a new version).
    note: str | None = None

    @model_validator(mode="after")
    def _latest_is_the_parent_unless_said(self) -> NewTurn:
        if "expected_latest_id" not in self.model_fields_set:
            self.expected_latest_id = self.parent_id
        return self


class TurnRecord(BaseModel):
    """One turn = one snapshot, as stored."""

    id: str
    session_id: str
    agent: str
    parent_id: str | None
    status: TurnStatus
    finish_reason: FinishReason | None = None
    input: TurnInput
    error: TurnError | None = None
    history_length: int = 0
    attempts: int = 0
    max_attempts: int = 1
    lease_token: int = 0
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    run_after: datetime
    created_at: datetime
    updated_at: datetime
    settled_at: datetime | None = None
    #: Tokens of all the turn's model calls, summed; ``None`` while no call reported usage.
    input_tokens: int | None = None
    output_tokens: int | None = None
    #: The creating request's W3C trace context (see :attr:`NewTurn.trace_context`).
    trace_context: dict[str, str] | None = None
    #: The session's custom state and artifacts (Genkit's JSON) as of the turn's last
    #: committed round: what a failed or aborted turn keeps.
    custom: Any = None
    artifacts: list[Any] | None = None
    #: What the turn is pinned to (see :attr:`NewTurn.app_version`); ``None`` for turns
    #: created before definitions were pinned, which any worker may run. The definition
    #: itself is read by fingerprint (:meth:`TurnQueue.read_definition`).
    app_version: str | None = None
    definition_fingerprint: str | None = None


class RoundRecord(BaseModel):
    """The messages one round of a turn wrote (see the module docstring)."""

    round: int
    messages: list[Message]
    committed: bool
    #: The session's custom state and artifacts after this committed round, when the round
    #: changed them: the store writes them onto the turn with the round.
    state: SessionData | None = None


class ToolCallStatus(StrEnum):
    """Life of one tool request in the journal."""

    REQUESTED = "requested"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    ANSWERED = "answered"


class ToolCallRecord(BaseModel):
    """One journal row, keyed by ``(turn_id, round, ref)``.

    ``idempotency_key`` is fixed when the request is first journaled and reused by every
    re-execution (crash recovery, restart after an interrupt). ``answer`` holds the decision
    on an interrupt (``{"respond": output}`` or ``{"restart": metadata}``).
    """

    turn_id: str
    round: int
    ref: str
    name: str
    input: Any = None
    status: ToolCallStatus
    output: Any = None
    interrupt: Any = None
    error: TurnError | None = None
    idempotency_key: str
    resumed: Any = None
    answer: Any = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: For a paused call of an interrupt declaring ``timeout=``: when it expires.
    deadline: datetime | None = None
    #: When the call was first journaled (set by the store; an approval's age counts from it).
    created_at: datetime | None = None
    #: The call's changes to the session's custom state and artifacts, in order
    #: (``{"customPatch": [...]}`` / ``{"artifact": {...}}``), replayed if its round is
    #: continued after a crash.
    effects: list[dict[str, Any]] | None = None


class StoredSnapshot(BaseModel):
    """A turn with its conversation and journal, as one read saw them (see
    :meth:`SessionStore.read_snapshot`)."""

    turn: TurnRecord
    #: The conversation as of the turn's committed rounds.
    conversation: list[Message]
    #: The turn's journal, ordered by round then ref.
    journal: list[ToolCallRecord]


class TurnProgress(BaseModel):
    """What a worker reads to run a claimed turn (see :meth:`SessionStore.read_progress`)."""

    #: The conversation of the turn's parent (empty for a first turn).
    parent_conversation: list[Message]
    #: The parent's journal (empty for a first turn): a resume's answers close its rows.
    parent_journal: list[ToolCallRecord]
    #: The turn's own rounds so far, committed or not, in order.
    rounds: list[RoundRecord]
    #: The turn's own journal so far, ordered by round then ref.
    journal: list[ToolCallRecord]


class InterruptAnswer(BaseModel):
    """The decision on one paused call, recorded when the resuming turn is created."""

    turn_id: str
    round: int
    ref: str
    answer: Any
    decided_by: str | None = None


class TurnEvent(BaseModel):
    """One status transition of a turn (the audit trail)."""

    turn_id: str
    from_status: TurnStatus | None
    to_status: TurnStatus
    attempt: int
    at: datetime
    note: str | None = None


class PendingApproval(BaseModel):
    """An unanswered, undecided interrupt of a session's latest turn (an inbox entry)."""

    turn_id: str
    session_id: str
    agent: str
    #: The principal the session belongs to (``None`` for sessions created locally).
    owner: str | None = None
    round: int
    interrupt: str
    ref: str
    input: Any = None
    metadata: Any = None
    deadline: datetime | None = None
    created_at: datetime
    #: The application version the paused turn is pinned to (``None``: created unpinned).
    app_version: str | None = None

    @classmethod
    def of(cls, turn: TurnRecord, call: ToolCallRecord, owner: str | None) -> PendingApproval:
        """The inbox entry for the paused ``call`` of ``turn`` (a session owned by ``owner``)."""
        return cls(
            turn_id=turn.id,
            session_id=turn.session_id,
            agent=turn.agent,
            owner=owner,
            round=call.round,
            interrupt=call.name,
            ref=call.ref,
            input=call.input,
            metadata=call.interrupt,
            deadline=call.deadline,
            # A store that keeps no journal time reports the moment the turn paused.
            created_at=call.created_at or turn.updated_at,
            app_version=turn.app_version,
        )


class ApprovalQuery(BaseModel):
    """Filters and keyset page of :meth:`SessionStore.list_approvals` (oldest first, or
    newest first with ``descending``)."""

    #: Only approvals of these agents (``None``: any agent).
    agents: tuple[str, ...] | None = None
    interrupt: str | None = None
    owner: str | None = None
    #: Only approvals created at or before this moment (i.e. at least this old).
    created_before: datetime | None = None
    #: Keyset cursor: the ``(created_at, turn_id, ref)`` of the last entry already seen.
    after: tuple[datetime, str, str] | None = None
    limit: int = Field(default=50, ge=1, le=1000)
    #: Newest first: the order, and the cursor, run backwards.
    descending: bool = False

    def admits(self, entry: PendingApproval) -> bool:
        """Whether ``entry`` passes the filters and lies after the cursor (in the order)."""
        key = (entry.created_at, entry.turn_id, entry.ref)
        return (
            (self.agents is None or entry.agent in self.agents)
            and (self.interrupt is None or entry.interrupt == self.interrupt)
            and (self.owner is None or entry.owner == self.owner)
            and (self.created_before is None or entry.created_at <= self.created_before)
            and (self.after is None or (key < self.after if self.descending else key > self.after))
        )


@dataclass
class FollowOnClaim:
    """A claim a worker asks its settling transition to make, for the slot the settle frees.

    The store runs it after the transition, in the same round trip and commit where it can
    (PostgreSQL), and reports what it leased in ``claimed``. ``ran`` says whether it ran at
    all (not when the transition failed before it): a claim that ran and leased nothing saw
    no claimable turn for ``agents`` at that moment. A ``limit`` below 1 withdraws it (a
    pool that is stopping): nothing is claimed and ``ran`` stays false.
    """

    owner: str
    lease_seconds: float
    agents: Collection[str] | None = None
    #: Only turns pinned to one of these application versions (or to none).
    versions: Collection[str] | None = None
    limit: int = 1
    claimed: list[TurnRecord] = field(default_factory=list)
    ran: bool = False

    @property
    def wanted(self) -> bool:
        """Whether the claim should run (not withdrawn)."""
        return self.limit >= 1


@dataclass(frozen=True)
class AbortOutcome:
    """What an abort request found and left (:meth:`SessionStore.request_abort`)."""

    #: The turn's status before the request: what Genkit's abort answers.
    previous: TurnStatus
    #: Its status after: ``aborting`` while its runner stops, ``aborted``, or ``previous``
    #: when it had already settled.
    status: TurnStatus


@dataclass(frozen=True, kw_only=True)
class Transition:
    """A guarded status change of a turn (see :meth:`SessionStore.transition`).

    The turn moves to ``new`` if its status is in ``expected`` and, unless ``lease_token`` is
    ``None``, its lease token matches; the move is recorded as a :class:`TurnEvent` with
    ``note``. Settling (or handing back with ``new=pending``, claimable again from
    ``run_after``, default now) releases the lease and advances the lease token, so the
    releasing worker can write nothing more. ``finish_reason`` is set when given. A settled
    turn carries exactly the ``error`` it settled with (``None`` clears an earlier attempt's).

    ``round``, ``calls`` and ``usage``, when given, are saved as
    :meth:`SessionStore.save_round` saves them, in the same transaction and under the same
    checks (they need a ``lease_token``: without one, constructing the change raises
    ``ValueError``): a worker settles its turn and writes the turn's last round with one
    commit, and nothing is written if the transition is refused.

    ``then_claim``: a claim to make next (see :class:`FollowOnClaim`); turns it leased are
    reported in it even when the transition itself is refused.
    """

    expected: Collection[TurnStatus]
    new: TurnStatus
    lease_token: int | None
    finish_reason: FinishReason | None = None
    error: TurnError | None = None
    run_after: datetime | None = None
    note: str | None = None
    round: RoundRecord | None = None
    calls: Sequence[ToolCallRecord] = ()
    usage: ModelUsage | None = None
    then_claim: FollowOnClaim | None = None

    def __post_init__(self) -> None:
        if self.saves and self.lease_token is None:
            raise ValueError("Saving a round with a transition needs the lease token.")

    @property
    def saves(self) -> bool:
        """Whether it writes a round, journal rows or token usage besides the move."""
        return self.round is not None or bool(self.calls) or self.usage is not None


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

    async def claim_turn(self, turn_id: str, *, owner: str, lease_seconds: float) -> TurnRecord:
        """Lease one specific ``pending`` turn that nobody holds (or whose lease expired)
        and whose ``run_after`` has come.

        Increments ``lease_token`` and ``attempts``. Raises
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
    ) -> list[TurnRecord]:
        """Lease up to ``limit`` claimable turns (oldest ``run_after`` first); with
        ``among``, only turns whose id is in it (e.g. the ids of :meth:`take_work_hints`);
        with ``versions``, only turns pinned to one of those application versions (turns
        pinned to none, created before pinning, are claimable by any worker)."""
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
        """Everything a worker needs to run (or continue) a claimed turn, read at one moment:
        its parent's conversation and journal, its own rounds and journal (``None`` for an
        unknown turn). One round trip where the store can."""
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

    async def record_decision(
        self,
        turn_id: str,
        round: int,
        ref: str,
        *,
        answer: Any,
        decided_by: str | None,
        assignment_seen: Assignment | None = None,
    ) -> ToolCallRecord:
        """Record one approver's decision on an open approval, ahead of the resume.

        The call stays ``interrupted`` (the resume that consumes the decisions marks it
        ``answered``); ``answer``, ``decided_by`` and ``decided_at`` are set. Guarded: the
        call must be ``interrupted`` and undecided on its session's latest turn, else
        :class:`~engine.errors.ApprovalNotPendingError` and nothing is written. With
        ``assignment_seen`` (the assignment the decider was checked against) the approval's
        assignment must not have changed since, checked under the same lock, else
        :class:`~engine.assignment_guard.AssignmentChangedError` and nothing is written.
        """
        ...

    async def list_expired_interrupts(
        self, *, now: datetime, limit: int = 100, agents: Collection[str] | None = None
    ) -> list[ToolCallRecord]:
        """Paused calls past their ``deadline`` that are still ``interrupted``, on turns that
        are their session's latest (``completed``, finish reason ``interrupted``), of
        ``agents`` when given (several apps may share one database)."""
        ...


class Retention(Protocol):
    """Deleting idle sessions with everything they hold."""

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


@runtime_checkable
class SessionStore(TurnQueue, Journal, Inbox, Retention, Relay, Protocol):
    """Persistence of sessions, turns, rounds and the tool-call journal: every part above.

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
