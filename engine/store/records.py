"""Every record a store reads or writes: turns, sessions, rounds, journal rows, open and
decided approvals, votes and assignments, and the errors a store's guards raise.

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

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from engine.conversation.parts import Message, Part
from engine.conversation.session_state import SessionData
from engine.errors import AgentError, ApprovalNotPendingError
from engine.model import ModelUsage
from engine.status import FinishReason, TurnStatus

__all__ = [
    "EDIT",
    "PAUSED",
    "AbortOutcome",
    "AlreadyVotedError",
    "ApprovalChange",
    "ApprovalClaimedError",
    "ApprovalQuery",
    "Assignment",
    "AssignmentChange",
    "AssignmentChangedError",
    "ClaimedTurn",
    "DecidedApproval",
    "DecisionQuery",
    "DueQuery",
    "EditedMeanwhileError",
    "FollowOnClaim",
    "InterruptAnswer",
    "Key",
    "NewTurn",
    "OpenApproval",
    "PendingApproval",
    "RoundRecord",
    "SessionRecord",
    "StoredSnapshot",
    "TimelineEntry",
    "ToolCallRecord",
    "ToolCallStatus",
    "Transition",
    "TurnError",
    "TurnEvent",
    "TurnInput",
    "TurnProgress",
    "TurnQuery",
    "TurnRecord",
    "TurnRow",
    "Vote",
    "VoteOutcome",
    "WaitingApproval",
    "WebhookDelivery",
    "WebhookEvent",
    "WebhookSettlement",
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
    #: For a ``resume`` a registered migration adjusted (:mod:`engine.state.versioning`): the
    #: paused message as the migration rewrote it (answered instead of the parent's last
    #: message), and the version the paused turn was pinned to.
    paused: Message | None = None
    migrated_from: str | None = None


class TurnError(BaseModel):
    """The error a failed turn recorded: ``{status, message, details?}`` as Genkit's."""

    status: str
    message: str
    details: Any = None

    def one_line(self) -> str:
        """``STATUS: message``, the message's whitespace collapsed (for a listing's row)."""
        return f"{self.status}: {' '.join(self.message.split())}"


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
    #: description of the agent definition it is pinned to (:mod:`engine.state.versioning`). The
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
    """What a worker needs to run a claimed turn: returned by its claim
    (:class:`ClaimedTurn`), or read (see :meth:`SessionStore.read_progress`)."""

    #: The conversation of the turn's parent (empty for a first turn).
    parent_conversation: list[Message]
    #: The parent's journal (empty for a first turn): a resume's answers close its rows.
    parent_journal: list[ToolCallRecord]
    #: The turn's own rounds so far, committed or not, in order.
    rounds: list[RoundRecord]
    #: The turn's own journal so far, ordered by round then ref.
    journal: list[ToolCallRecord]


class ClaimedTurn(BaseModel):
    """A turn a claim leased, with its progress read by the same claim: what a worker needs to
    run it, without a read of its own between the claim and the first model call."""

    turn: TurnRecord
    progress: TurnProgress


class InterruptAnswer(BaseModel):
    """The decision on one paused call, recorded when the resuming turn is created."""

    turn_id: str
    round: int
    ref: str
    answer: Any
    decided_by: str | None = None


class TimelineEntry(BaseModel):
    """One thing that happened to a turn (see :class:`engine.store.TurnTimeline`)."""

    at: datetime
    kind: str
    detail: str
    #: The turn's attempt when it happened (0: before any worker claimed it).
    attempt: int | None = None
    #: Who did it: the worker running the attempt, or the principal deciding or assigning.
    actor: str | None = None


class TurnEvent(BaseModel):
    """One entry of a turn's append-only history: a status transition (``kind`` ``status``)
    or another change (:mod:`engine.store.history` names the kinds), which leaves
    ``from_status`` empty and ``to_status`` the status the turn was in."""

    turn_id: str
    from_status: TurnStatus | None
    to_status: TurnStatus
    attempt: int
    at: datetime
    note: str | None = None
    kind: str = "status"
    actor: str | None = None
    detail: dict[str, Any] | None = None


class ApprovalEntry(BaseModel):
    """What every list of approvals shows of one, open or decided: the paused call, what it
    asked, and whose session it is."""

    turn_id: str
    session_id: str
    agent: str
    #: The principal the session belongs to, who asked (``None`` for local sessions).
    owner: str | None = None
    round: int
    interrupt: str
    ref: str
    input: Any = None
    metadata: Any = None


class PendingApproval(ApprovalEntry):
    """An unanswered, undecided interrupt of a session's latest turn (an inbox entry)."""

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
    claimed: list[ClaimedTurn] = field(default_factory=list)
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


class AlreadyVotedError(AgentError):
    """This approver has already voted on this approval; a vote counts once (HTTP 409)."""

    default_status = "ALREADY_EXISTS"


class Vote(BaseModel):
    """One approver's recorded vote on one approval."""

    turn_id: str
    round: int
    ref: str
    voter: str
    answer: Any = None
    #: Whether the vote counts towards the quorum (an approval); any other vote decides.
    approves: bool
    voted_at: datetime


@dataclass
class VoteOutcome:
    """What a change of an open approval did: its votes now, and its decision if the change
    recorded one."""

    votes: list[Vote]
    decided: ToolCallRecord | None = None


@dataclass(frozen=True)
class OpenApproval:
    """An open approval as a store read it under its journal row's lock: the row, its votes
    (oldest first), its stored assignment (``None``: none stored yet) and the store's clock."""

    call: ToolCallRecord
    votes: list[Vote]
    assignment: Assignment | None
    now: datetime


@dataclass(frozen=True)
class ApprovalChange:
    """What to write on an open approval, in this order and in one transaction: the votes
    cleared, a vote added, the decision recorded (its ``answer`` and ``decided_by``)."""

    clear_votes: bool = False
    vote: Vote | None = None
    decides: bool = False
    answer: Any = None
    decided_by: str | None = None
    #: Webhook deliveries reporting the decision, written to the outbox in the same transaction.
    deliveries: tuple[WebhookDelivery, ...] = ()


WebhookEvent = Literal["opened", "reminded", "escalated", "decided"]


class WebhookDelivery(BaseModel):
    """One webhook event for one endpoint, as the outbox keeps it until it is delivered or
    given up (:mod:`engine.approvals.webhooks`).

    ``id`` is derived from ``event_id`` and ``url``, so writing the same event twice keeps
    one row; the endpoint's secret is never stored, only looked up by ``url`` when sending.
    """

    id: str
    event_id: str
    event: WebhookEvent
    turn_id: str
    round: int
    ref: str
    url: str
    #: The request body, rendered once so every attempt sends the same bytes.
    body: str
    occurred_at: datetime
    status: Literal["pending", "delivered", "failed"] = "pending"
    attempts: int = 0
    next_attempt_at: datetime | None = None
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    last_error: str | None = None
    delivered_at: datetime | None = None


class WebhookSettlement(BaseModel):
    """The outcome of one attempt at a claimed delivery, written only while the claim's
    ``lease_token`` still holds it: ``delivered``, ``retry`` at ``retry_at``, or ``failed``
    for good."""

    id: str
    lease_token: str
    outcome: Literal["delivered", "retry", "failed"]
    error: str | None = None
    retry_at: datetime | None = None
    at: datetime


class AssignmentChangedError(ApprovalNotPendingError):
    """The approval was claimed, reassigned, released or escalated after the decider's check
    (HTTP 409): nothing was recorded, and the decider may no longer be allowed to decide it."""


class Assignment(BaseModel):
    """Who an open approval is assigned to, and its escalation and reminders so far."""

    turn_id: str
    round: int
    ref: str
    assignee: str | None = None
    group: str | None = None
    assigned_by: str | None = None
    assigned_at: datetime | None = None
    escalated_at: datetime | None = None
    escalated_from_assignee: str | None = None
    escalated_from_group: str | None = None
    escalated_to: str | None = None
    #: The step of the interrupt's escalation chain it reached (0: not escalated); the
    #: ``escalated_*`` fields describe that step.
    escalation_step: int = 0
    last_reminded_at: datetime | None = None
    reminders: int = 0

    @property
    def is_assigned(self) -> bool:
        """Whether anyone (a person or a group) holds it."""
        return self.assignee is not None or self.group is not None

    def describe(self) -> str:
        """``"alice"``, ``"group payments"``, ``"alice (group payments)"`` or ``"nobody"``."""
        if self.assignee and self.group:
            return f"{self.assignee} (group {self.group})"
        if self.assignee:
            return self.assignee
        if self.group:
            return f"group {self.group}"
        return "nobody"

    @property
    def version(self) -> tuple[Any, ...] | None:
        """What a claim, assignment, release or escalation changes (a reminder does not);
        ``None`` while nobody changed the interrupt's default assignment."""
        if self.assigned_at is None:
            return None
        return (self.assignee, self.group, self.assigned_by, self.assigned_at, self.escalated_at)


Key = tuple[str, int, str]


class ApprovalClaimedError(AgentError):
    """Someone else holds this approval (HTTP 409): they release it, or it is reassigned."""

    default_status = "ABORTED"


class AssignmentChange(BaseModel):
    """One change of an approval's assignment, and the guard the store checks with it.

    * ``claim``: ``assignee = by``, only when nobody or ``by`` holds it;
    * ``assign``: ``group`` (when given; the assignee then becomes ``assignee``) and/or
      ``assignee``;
    * ``release``: no assignee, only when ``holder`` holds it (``holder=None``: whoever does);
    * ``escalate``: ``group = group``, no assignee, the previous ones recorded, the step
      reached becoming ``from_step + 1``, only when it is still at step ``from_step`` (each
      step of a chain moves it once);
    * ``remind``: ``last_reminded_at = now``, only when not reminded in the last
      ``every_seconds``.
    """

    action: Literal["claim", "assign", "release", "escalate", "remind"]
    by: str | None = None
    assignee: str | None = None
    group: str | None = None
    holder: str | None = None
    every_seconds: float | None = None
    #: The escalation step an ``escalate`` moves the approval from (0: not escalated yet).
    from_step: int = 0
    #: The moment of the change (``None``: the store's clock); the sweep passes its own.
    at: datetime | None = None
    #: Webhook deliveries reporting the change, written only if the change is (same transaction).
    deliveries: tuple[WebhookDelivery, ...] = ()


class DueQuery(BaseModel):
    """Open approvals of one interrupt due for an escalation or a reminder."""

    agents: tuple[str, ...]
    interrupt: str
    #: Only approvals created at or before this moment.
    created_before: datetime
    #: Only approvals at this step of their escalation chain (0: not escalated yet).
    escalation_step: int | None = None
    #: Only approvals whose last escalation was at or before this moment.
    escalated_before: datetime | None = None
    #: Only approvals never reminded, or last reminded at or before this moment.
    reminded_before: datetime | None = None
    limit: int = 100


class DecidedApproval(ApprovalEntry):
    """One decided interrupt, with the turn that continued from its paused turn."""

    #: ``{"respond": output}`` or ``{"restart": metadata}``, as recorded (a restart with
    #: edited arguments also holds ``"edit"``, see :attr:`edit`).
    answer: Any = None
    decided_by: str | None = None
    decided_at: datetime
    #: When the interrupt was journaled (the approval's creation).
    created_at: datetime | None = None
    #: The first turn created from the paused one (the resume), once there is one.
    next_turn_id: str | None = None
    next_status: TurnStatus | None = None
    next_finish_reason: FinishReason | None = None
    #: When the approval's timeout escalated it before it was decided (``None``: it never did).
    escalated_at: datetime | None = None
    #: The group and the assignee that held it when it escalated.
    escalated_from_group: str | None = None
    escalated_from_assignee: str | None = None
    #: The group it escalated to.
    escalated_to: str | None = None
    #: The step of its escalation chain it reached (0: none; the ``escalated_*`` fields
    #: describe that last step).
    escalation_step: int = 0

    @property
    def edit(self) -> dict[str, Any] | None:
        """The approver's edit of the call's arguments recorded with the decision: ``input``
        (the edited arguments), ``diff`` (``[{"field", "old", "new"}]``), ``by`` and ``at``."""
        edit = self.answer.get("edit") if isinstance(self.answer, dict) else None
        return edit if isinstance(edit, dict) else None

    @property
    def key(self) -> tuple[datetime, str, str]:
        """The history's order key: decision time, then turn and ref."""
        return self.decided_at, self.turn_id, self.ref


class DecisionQuery(BaseModel):
    """Filters and keyset page of :meth:`ApprovalHistory.list_decisions` (newest first)."""

    agents: tuple[str, ...] | None = None
    interrupt: str | None = None
    #: Only approvals of sessions owned by this principal (who asked).
    owner: str | None = None
    decided_by: str | None = None
    #: Keyset cursor: the ``(decided_at, turn_id, ref)`` of the last entry already seen.
    before: tuple[datetime, str, str] | None = None
    limit: int = Field(default=50, ge=1, le=1000)

    def admits(self, entry: DecidedApproval) -> bool:
        """Whether ``entry`` passes the filters and lies after the cursor (is older)."""
        return (
            (self.agents is None or entry.agent in self.agents)
            and (self.interrupt is None or entry.interrupt == self.interrupt)
            and (self.owner is None or entry.owner == self.owner)
            and (self.decided_by is None or entry.decided_by == self.decided_by)
            and (self.before is None or entry.key < self.before)
        )


#: The key of the recorded edit in a journal answer.
EDIT = "edit"


class EditedMeanwhileError(ApprovalNotPendingError):
    """Another approver edited the call's arguments after this one read them (HTTP 409)."""


# -- turns by filter (the operators' ``turns ls`` and the browser's runs page) ----------------

#: The status filter for turns paused at approvals (``completed`` / ``interrupted``).
PAUSED = "paused"


class TurnQuery(BaseModel):
    """Which turns to list: every filter given must hold; newest first (``created_at``, then
    id, both descending), keyset-paged by ``before``."""

    #: Statuses (``pending``, …, or :data:`PAUSED`); ``None`` or empty: any.
    statuses: tuple[str, ...] | None = None
    agent: str | None = None
    #: Only turns of these agents (the agents a server serves from the store).
    agents: tuple[str, ...] | None = None
    session_id: str | None = None
    #: Only turns of sessions owned by this principal (who asked).
    owner: str | None = None
    #: Only turns pinned to this application version.
    app_version: str | None = None
    #: Only turns whose id starts with these characters (taken literally).
    id_prefix: str | None = None
    #: Only turns created at or after this moment.
    since: datetime | None = None
    #: Keyset cursor: the ``(created_at, id)`` of the last turn already seen.
    before: tuple[datetime, str] | None = None
    #: Only turns that are their session's latest (the ones a retry may continue).
    latest_only: bool = False
    limit: int = Field(default=50, ge=1, le=100_000)


class WaitingApproval(BaseModel):
    """An open, undecided approval a paused turn waits for."""

    turn_id: str
    ref: str
    interrupt: str
    created_at: datetime
    #: What the approver is shown (the interrupt's input).
    input: Any = None


class TurnRow(BaseModel):
    """One turn as a list shows it."""

    id: str
    session_id: str
    seq: int
    agent: str
    parent_id: str | None
    status: TurnStatus
    finish_reason: FinishReason | None
    input_kind: str
    attempts: int
    max_attempts: int
    error: TurnError | None
    created_at: datetime
    updated_at: datetime
    settled_at: datetime | None
    waiting: list[WaitingApproval] = Field(default_factory=list)
    #: The text of the user's message the turn started with (a ``message`` turn).
    message_text: str | None = None
    #: Who owns the turn's session (``None``: a local caller).
    owner: str | None = None
    #: The application version the turn is pinned to (``None``: created before pinning).
    app_version: str | None = None

    @property
    def key(self) -> tuple[datetime, str]:
        """The row's place in the newest-first order (what ``TurnQuery.before`` takes)."""
        return self.created_at, self.id

    def about(self, describe: Callable[[str, Any], str]) -> str:
        """What the turn is about: what the approvals it waits for ask (each put in words by
        ``describe(interrupt, input)``), the error it failed with, or the user's message it
        started with (else its kind: ``resume``, ``retry`` ...)."""
        if self.waiting:
            return "; ".join(describe(w.interrupt, w.input) for w in self.waiting)
        if self.error is not None:
            return self.error.one_line()
        return self.message_text or self.input_kind
