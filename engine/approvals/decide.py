"""The approval inbox: deciding interrupts one at a time, by people who are not the chat.

Genkit's resume answers every paused call of a turn at once, from the chat's client. A
long-lived approval workflow has approvers elsewhere — a manager, days later, in another
process — and a turn may wait on several of them. Each approver records a *decision* on one
open approval (guarded: an approval is decided once); when the last paused call of the turn
has its decision, the resume is built from the recorded decisions and enqueued like any
other, so validation, the one-resume guard and execution are the ordinary ones.

An interrupt with an approval policy (:mod:`engine.approval_policy`) is decided by *votes*:
:func:`decide` checks who may vote (maker-checker included), records the vote, and the store
writes the decision only when the quorum is reached or a vote that is not an approval decides.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, StrictBool, model_validator

from engine.approval_policy import ApprovalPolicy, Approver
from engine.approvals.assignment import check_may_decide
from engine.approvals.edits import check_arguments_seen, make_edit, standing_edit
from engine.approvals.rules import decision_rule, vote_rule
from engine.approvals.webhooks import announcing_decision
from engine.conversation.parts import RESUMED, Part
from engine.conversation.schemas import SchemaViolation, to_jsonable
from engine.errors import (
    ApprovalNotPendingError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    SessionBusyError,
    TurnFailedError,
)
from engine.rejection import REJECT, Rejection, rejection_part, rejection_record
from engine.state.pinning import check_resumable
from engine.status import FinishReason, TurnStatus
from engine.store import (
    EDIT,
    PendingApproval,
    SessionStore,
    ToolCallRecord,
    ToolCallStatus,
    TurnInput,
    TurnRecord,
    Vote,
    VoteBook,
)

if TYPE_CHECKING:
    from engine.agent import Agent
    from engine.tools import Tool

__all__ = [
    "Decision",
    "DecisionOutcome",
    "NamedApprover",
    "approval_id",
    "approval_policy",
    "decide",
    "find_approval",
    "parse_approval_id",
    "yes_no_answer",
]

logger = logging.getLogger("turnstile.inbox")


def approval_id(turn_id: str, ref: str) -> str:
    """The inbox id of one approval: ``<turn id>:<ref>`` (turn ids never hold a colon)."""
    return f"{turn_id}:{ref}"


def parse_approval_id(value: str) -> tuple[str, str]:
    """``(turn_id, ref)`` of an inbox id; :class:`NotFoundError` when it cannot be one."""
    turn_id, colon, ref = value.partition(":")
    # No stored id holds a NUL, and PostgreSQL refuses one in a query parameter (a 500).
    if not colon or not turn_id or not ref or "\x00" in value:
        raise NotFoundError(f"Approval '{value}' not found.")
    return turn_id, ref


class Decision(BaseModel):
    """An approver's answer to one interrupt: ``{"respond": output}``, ``{"restart": true}``
    or ``{"reject": {"reason": ...}}``.

    ``respond`` is validated against the interrupt's output schema; ``restart`` re-runs the
    paused tool (for a pure interrupt that asks again), with ``resumed`` as ``ctx.resumed``;
    ``reject`` never runs it and answers the model with a refusal carrying the reason
    (:mod:`engine.rejection`; ``Decision(reject="reason")`` is short for it).
    """

    model_config = ConfigDict(extra="forbid")

    respond: Any = None
    # Strict, like the wire's other flags: "yes" or 1 is a mistake to report, not a restart.
    restart: StrictBool = False
    resumed: Any = None
    #: Fields of the paused call's arguments to change before it restarts (editable tools
    #: only, see :mod:`engine.approvals.edits`): field → new value, ``null`` removes the field.
    edit: dict[str, Any] | None = None
    #: The call's arguments as the approver read them (optional): the decision is refused
    #: when an edit under a quorum changed them meanwhile.
    arguments: Any = None
    #: Say no: the call's effect never runs; the model reads a refusal with this reason.
    reject: Rejection | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Decision:
        responding = "respond" in self.model_fields_set
        if responding + self.restart + (self.reject is not None) != 1:
            raise ValueError(
                "a decision is exactly one of 'respond' (an output), 'restart': true or "
                "'reject': {'reason': ...}"
            )
        if self.resumed is not None and not self.restart:
            raise ValueError("'resumed' goes with 'restart'")
        if self.edit is not None and not self.restart:
            raise ValueError("'edit' goes with 'restart' (the edited call runs)")
        return self

    def answer(self, *, by: str | None = None) -> dict[str, Any]:
        """The journal's form (``{"respond": output}``, ``{"restart": metadata}`` or
        ``{"reject": {"reason", "by", "at"}}``, a reject recorded as decided by ``by``)."""
        if self.reject is not None:
            return {REJECT: rejection_record(self.reject, by=by)}
        if self.restart:
            return {"restart": to_jsonable(self.resumed) if self.resumed is not None else True}
        return {"respond": to_jsonable(self.respond)}


def yes_no_answer(schema: dict[str, Any] | None, approved: bool) -> Any:
    """The answer a plain approve (``True``) or deny (``False``) gives, with nothing more said:
    the boolean itself for an interrupt answering a boolean (or declaring no schema),
    ``{"approved": …}`` for one answering an object with a boolean ``approved``; ``None``
    when the schema asks for more than a yes or a no."""
    if not schema:
        return approved
    if schema.get("type") == "boolean":
        return approved
    properties = schema.get("properties")
    if schema.get("type") == "object" and isinstance(properties, dict):
        flag = properties.get("approved")
        required = set(schema.get("required") or []) - {"approved"}
        if isinstance(flag, dict) and flag.get("type") == "boolean" and not required:
            return {"approved": approved}
    return None


@dataclass
class DecisionOutcome:
    """What a decision led to."""

    decided: ToolCallRecord
    #: The resume turn enqueued (or run) because this was the last missing decision.
    resume_snapshot_id: str | None = None
    #: Refs of the turn's paused calls still waiting for a decision.
    waiting_for: list[str] = field(default_factory=list)
    #: The votes on this approval so far (interrupts with an approval policy only).
    votes: list[Vote] = field(default_factory=list)
    #: Whether the decision is recorded (``False``: the vote left the quorum open).
    is_decided: bool = True


@dataclass(frozen=True)
class NamedApprover:
    """An approver known only by id (the CLI's ``--by``): it holds no roles."""

    id: str
    roles: frozenset[str] = frozenset()


def approval_policy(agent: Agent, approval: PendingApproval) -> ApprovalPolicy | None:
    """The approval policy of the interrupt ``approval`` pauses on (``None``: none)."""
    tool = agent.tools.get(approval.interrupt)
    return getattr(tool, "approval_policy", None) if tool is not None else None


async def find_approval(
    store: SessionStore, turn_id: str, ref: str
) -> tuple[PendingApproval, bool] | None:
    """The interrupt ``ref`` of turn ``turn_id`` as an inbox entry, and whether it is still
    open (undecided, on a paused turn that is its session's latest); ``None`` if no such
    interrupt was ever journaled."""
    turn = await store.get_turn(turn_id)
    if turn is None:
        return None
    for call in await store.list_calls(turn_id):
        if call.ref != ref or call.interrupt is None:
            continue
        session = await store.get_session(turn.session_id)
        entry = PendingApproval.of(turn, call, session.owner if session else None)
        is_open = (
            call.status is ToolCallStatus.INTERRUPTED
            and call.decided_at is None
            and await _paused_and_latest(store, turn)
        )
        return entry, is_open
    return None


async def _paused_and_latest(store: SessionStore, turn: TurnRecord) -> bool:
    if (turn.status, turn.finish_reason) != (TurnStatus.COMPLETED, FinishReason.INTERRUPTED):
        return False
    latest = await store.latest_turn(turn.session_id)
    return latest is not None and latest.id == turn.id


async def decide(
    agent: Agent,
    approval: PendingApproval,
    decision: Decision,
    *,
    decided_by: str | None,
    approver: Approver | None = None,
) -> DecisionOutcome:
    """Record ``decision`` on ``approval``; enqueue the resume once every call is decided.

    ``approver`` is who decides, with roles (``decided_by`` alone is read as an approver of
    that id without roles); a reject is recorded with its id as ``by``, and its resume answers
    the call with a refusal instead of running it (:mod:`engine.rejection`).

    Raises :class:`InvalidArgumentError` (nothing written) when a respond output violates the
    interrupt's output schema; :class:`~engine.approval_policy.ApprovalRefusedError` when the
    interrupt's approval policy does not let this approver cast this vote or the approval is
    assigned to others (:mod:`engine.approvals.assignment`); the errors of
    :func:`engine.approvals.edits.make_edit` for an edit the tool does not allow or whose
    arguments break its input schema; :class:`ApprovalNotPendingError` when the approval was
    decided or answered meanwhile — :class:`~engine.store.AssignmentChangedError` when it was
    claimed, reassigned or escalated after the assignment check (nothing written; the
    approver may decide again).
    """
    store = agent.store
    if store is None:
        raise FailedPreconditionError(
            f"The inbox needs a session store; agent '{agent.name}' uses client-managed state."
        )
    if approval.app_version is not None:
        # A decision on a turn this app's definition can no longer resume would be recorded
        # and then stranded: refuse it first, naming what changed.
        paused_turn = await store.get_turn(approval.turn_id)
        if paused_turn is not None:
            await check_resumable(agent, paused_turn, store)
    if approver is None and decided_by is not None:
        approver = NamedApprover(id=decided_by)
    answer = decision.answer(by=approver.id if approver is not None else decided_by)
    tool = agent.tools.get(approval.interrupt)
    if "respond" in answer and tool is not None:
        try:
            tool.output.check_json(answer["respond"])
        except SchemaViolation as exc:
            raise InvalidArgumentError(
                f"The decision on '{approval.interrupt}' (ref: {approval.ref}) does not match "
                f"its output schema: {exc}"
            ) from exc
    # An assigned approval is decided by its assignee or its group (engine.approvals.assignment).
    # Checked again under the lock that records the decision: a reassignment committed
    # meanwhile refuses it there.
    assignment = await check_may_decide(agent, approval, approver)
    policy = approval_policy(agent, approval)
    votes: list[Vote] = []
    if policy is None:
        check_arguments_seen(approval.interrupt, decision.arguments, approval.input)
        _add_edit(answer, tool, approval, decision, decided_by)
        outcome = await store.change_approval(
            approval.turn_id,
            approval.round,
            approval.ref,
            announcing_decision(
                agent,
                approval,
                decision_rule(answer, decided_by=decided_by, assignment_seen=assignment),
            ),
        )
        assert outcome.decided is not None  # a decision rule always decides
        decided = outcome.decided
    else:
        denies = policy.is_denial(answer)
        # A restart asks again: it may not come from the requester, and it decides at once.
        policy.check(approver, requester=approval.owner, approving=not denies)
        approves = _approves(tool, answer, denies)
        assert approver is not None  # check() refuses an anonymous approver
        standing = await _standing_edit(store, approval)
        check_arguments_seen(
            approval.interrupt,
            decision.arguments,
            standing["input"] if standing is not None else approval.input,
        )
        _add_edit(answer, tool, approval, decision, approver.id, standing)
        if approves and EDIT not in answer and standing is not None:
            # An approval without an edit approves the arguments as the last edit left them.
            answer[EDIT] = standing
        outcome = await store.change_approval(
            approval.turn_id,
            approval.round,
            approval.ref,
            announcing_decision(
                agent,
                approval,
                vote_rule(
                    voter=approver.id,
                    answer=answer,
                    approves=approves,
                    required=policy.required_approvals,
                    # Earlier votes approved other arguments: an edit starts the count again.
                    resets=decision.edit is not None,
                    # Counted only if no edit landed since the votes were read above.
                    edit_seen=standing,
                    assignment_seen=assignment,
                ),
            ),
        )
        votes = outcome.votes
        if outcome.decided is None:
            logger.info(
                "approval %s: vote by %s, %d of %d approvals",
                approval_id(approval.turn_id, approval.ref),
                approver.id,
                sum(v.approves for v in votes),
                policy.required_approvals,
            )
            return DecisionOutcome(
                decided=await _call(store, approval), votes=votes, is_decided=False
            )
        decided = outcome.decided
    logger.info(
        "approval %s decided by %s",
        approval_id(approval.turn_id, approval.ref),
        decided.decided_by or "an anonymous caller",
    )
    journal = await store.list_calls(approval.turn_id)
    paused = [c for c in journal if c.status is ToolCallStatus.INTERRUPTED]
    waiting = [c.ref for c in paused if c.decided_at is None]
    if waiting:
        return DecisionOutcome(decided=decided, waiting_for=waiting, votes=votes)
    if not paused:
        # A concurrent decision on the same turn already enqueued the resume, which closed
        # every paused row: that resume carries this decision too.
        return DecisionOutcome(decided=decided, votes=votes)
    return DecisionOutcome(
        decided=decided, resume_snapshot_id=await _resume(agent, paused), votes=votes
    )


def _approves(tool: Tool | None, answer: dict[str, Any], denies: bool) -> bool:
    """Whether a vote counts towards the quorum: answering an interrupt with anything but a
    denial, or restarting (running) a tool that paused itself; answering such a tool in its
    place decides at once, as a denial does; a reject never approves."""
    if REJECT in answer:
        return False
    if tool is not None and not tool.is_interrupt:
        return "restart" in answer
    return "respond" in answer and not denies


def _add_edit(
    answer: dict[str, Any],
    tool: Tool | None,
    approval: PendingApproval,
    decision: Decision,
    by: str | None,
    standing: dict[str, Any] | None = None,
) -> None:
    """Record the decision's edit (validated, as a diff with who and when) in ``answer``;
    it applies to the arguments as ``standing`` (an earlier vote's edit) left them."""
    if decision.edit is not None:
        answer[EDIT] = make_edit(
            tool,
            approval.interrupt,
            approval.input,
            decision.edit,
            by=by,
            current=standing["input"] if standing is not None else None,
        )


async def _standing_edit(book: VoteBook, approval: PendingApproval) -> dict[str, Any] | None:
    """The edit the approval's votes stand on now (``None``: none)."""
    return standing_edit(await book.list_votes(approval.turn_id, approval.round, approval.ref))


async def _call(store: SessionStore, approval: PendingApproval) -> ToolCallRecord:
    """The journal row of ``approval`` as it is now."""
    for call in await store.list_calls(approval.turn_id):
        if (call.round, call.ref) == (approval.round, approval.ref):
            return call
    raise NotFoundError(f"Approval '{approval_id(approval.turn_id, approval.ref)}' not found.")


async def _resume(agent: Agent, decided: list[ToolCallRecord]) -> str | None:
    """Enqueue the resume built from every recorded decision of one paused turn."""
    from engine.agent import TurnRequest

    respond: list[Part] = []
    restart: list[Part] = []
    for call in decided:
        answer = call.answer if isinstance(call.answer, dict) else {}
        if "respond" in answer:
            respond.append(Part.of_response(call.name, call.ref, answer["respond"]))
        elif REJECT in answer:
            # The refusal answers the call in the tool's place: the tool never runs.
            respond.append(rejection_part(call, answer[REJECT]))
        else:
            # An approver's recorded edit restarts the call with the edited arguments.
            arguments = answer[EDIT]["input"] if EDIT in answer else call.input
            restart.append(
                Part.of_request(call.name, call.ref, arguments, {RESUMED: answer.get("restart")})
            )
    turn_id = decided[0].turn_id
    request = TurnRequest(
        input=TurnInput(kind="resume", respond=respond, restart=restart), snapshot_id=turn_id
    )
    try:
        response = await agent.submit(request)
    except TurnFailedError as failure:  # an inline agent ran the resume and it failed
        return failure.snapshot_id
    except (ApprovalNotPendingError, SessionBusyError) as race:
        # Two approvers decided the last two calls at once and both enqueue: one wins.
        logger.info("resume of %s already enqueued by another decision (%s)", turn_id, race)
        return None
    return response.snapshot_id
