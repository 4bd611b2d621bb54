"""Assignment, escalation and reminders of open approvals.

An open approval may be *assigned*: to a person (``assignee``, a principal id) and/or to a
group (``group``, a role name). ``define_interrupt(..., group="payments")`` assigns every
approval of the interrupt to a group from the start; :func:`claim`, :func:`assign` and
:func:`release` change it later. The rules, which :func:`engine.approvals.decide.decide` enforces
for every decision path:

* **Assignment restricts who decides.** An approval assigned to anyone may be decided, claimed
  or reassigned only by its assignee or a member of its group (a principal holding the role),
  in addition to the interrupt's approval policy. An unassigned approval is restricted by the
  policy alone.
* **Claim** takes an approval for oneself (it keeps its group); an approval claimed by someone
  else cannot be claimed (:class:`ApprovalClaimedError`) until that person releases it or
  somebody allowed to decide it reassigns it. **Release** hands a claim back to the group.
  **Assign** to a group clears the person (the group's members pick it up) unless a person is
  named too; assign to a person alone keeps the group.
* **Escalation.** ``timeout=`` with ``on_timeout={"escalate": "group"}``: once the approval
  has been open that long, the worker's sweep (:func:`sweep_assignments`) moves it to that
  group, once, recording when and from whom. A chain (:mod:`engine.escalation`)
  moves it on from group to group, each step once after its own wait. It does not decide
  it: the turn stays paused.
* **Reminders.** ``remind_every=``: while the approval stays open, the sweep logs a reminder
  (``turnstile.assignment``, with the turn, session, approval and assignee) once per interval
  and reports it to the metrics; the last reminder's time is stored, so several workers remind
  once.

Every change is one guarded UPDATE in the store (:class:`AssignmentBook`), so two sweeps or two
approvers at once change an approval once. A decision is written only if the assignment its
decider was checked against still stands, compared by the store under the lock that records
the decision (:class:`AssignmentChangedError` otherwise); every change takes that lock too, so
a decision and a change at once are serialised and a decided approval never escalates.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from engine.approval_policy import ApprovalPolicy, ApprovalRefusedError, Approver, same_principal
from engine.approvals.webhooks import change_deliveries
from engine.errors import AgentError, FailedPreconditionError, InvalidArgumentError
from engine.escalation import EscalationChain
from engine.store import (
    ApprovalClaimedError,
    Assignment,
    AssignmentBook,
    AssignmentChange,
    AssignmentChangedError,
    DueQuery,
    Key,
    PendingApproval,
    SessionStore,
    WebhookDelivery,
)
from engine.store.rules import apply_change
from engine.telemetry import instruments

if TYPE_CHECKING:
    from engine.agent import Agent
    from engine.engine import Engine

__all__ = [
    "ESCALATION_ACTOR",
    "ApprovalClaimedError",
    "Assignment",
    "AssignmentBook",
    "AssignmentChange",
    "AssignmentChangedError",
    "DueQuery",
    "SweepReport",
    "apply_change",
    "assign",
    "assigned_matches",
    "check_may_decide",
    "check_target",
    "claim",
    "current_assignment",
    "current_assignments",
    "may_act",
    "needs_quorum",
    "release",
    "sweep_assignments",
]

logger = logging.getLogger("turnstile.assignment")

#: Recorded as ``assigned_by`` when the sweep escalates an approval.
ESCALATION_ACTOR = "escalation"


@dataclass
class SweepReport:
    """What one sweep did."""

    escalated: list[Assignment] = field(default_factory=list)
    reminded: list[Assignment] = field(default_factory=list)


def _default_group(agent: Agent, interrupt: str) -> str | None:
    return getattr(agent.tools.get(interrupt), "group", None)


async def current_assignment(agent: Agent, approval: PendingApproval) -> Assignment:
    """The assignment of ``approval`` now: the stored one, else the interrupt's ``group``."""
    store = agent.store
    if store is not None:
        key = (approval.turn_id, approval.round, approval.ref)
        stored = (await store.get_assignments([key])).get(key)
        if stored is not None:
            return stored
    return Assignment(
        turn_id=approval.turn_id,
        round=approval.round,
        ref=approval.ref,
        group=_default_group(agent, approval.interrupt),
    )


async def current_assignments(
    agent_of: Mapping[str, Agent], approvals: Sequence[PendingApproval]
) -> dict[Key, Assignment]:
    """:func:`current_assignment` of many approvals, one read per store."""
    by_store: dict[int, tuple[AssignmentBook, list[Key]]] = {}
    for a in approvals:
        store = agent_of[a.agent].store if a.agent in agent_of else None
        if store is not None:
            by_store.setdefault(id(store), (store, []))[1].append((a.turn_id, a.round, a.ref))
    stored: dict[Key, Assignment] = {}
    for book, keys in by_store.values():
        stored.update(await book.get_assignments(keys))
    found: dict[Key, Assignment] = {}
    for a in approvals:
        key = (a.turn_id, a.round, a.ref)
        agent = agent_of.get(a.agent)
        found[key] = stored.get(key) or Assignment(
            turn_id=a.turn_id,
            round=a.round,
            ref=a.ref,
            group=_default_group(agent, a.interrupt) if agent is not None else None,
        )
    return found


def assigned_matches(
    principal: Approver | None,
    assignment: Assignment,
    wanted: str | None,
    *,
    quorum: bool = False,
) -> bool:
    """Whether an approval so assigned belongs in ``principal``'s inbox under the assignment
    filter ``wanted``: never one assigned to others (they alone may decide it; under a
    ``quorum``, see :func:`may_act`), except on a server without sign-in, whose viewers see
    everything."""
    if principal is not None and not may_act(principal, assignment, quorum=quorum):
        return False
    if wanted == "me":
        return principal is not None and assignment.assignee == principal.id
    if wanted == "groups":
        return principal is not None and assignment.group in principal.roles
    if wanted == "unassigned":
        return not assignment.is_assigned
    return True


def may_act(approver: Approver | None, assignment: Assignment, *, quorum: bool = False) -> bool:
    """Whether ``approver`` may decide (claim, reassign) an approval so assigned.

    ``quorum``: the approval needs several approvers. A person holding it without a group
    (a claim, an assignment) then does not shut the others out, or the quorum could never be
    reached: the approval stays open to everyone its policy admits."""
    if not assignment.is_assigned:
        return True
    if approver is None:
        return False
    if approver.id == assignment.assignee:
        return True
    if assignment.group is not None:
        return assignment.group in approver.roles
    return quorum


def _refuse(approver: Approver | None, assignment: Assignment) -> ApprovalRefusedError:
    if approver is None:
        return ApprovalRefusedError(
            f"This approval is assigned to {assignment.describe()}: it needs an authenticated "
            "approver."
        )
    return ApprovalRefusedError(
        f"'{approver.id}' may not act on this approval: it is assigned to {assignment.describe()}."
    )


def needs_quorum(agent: Agent | None, approval: PendingApproval) -> bool:
    """Whether ``approval`` needs several approvers (its interrupt's policy says so)."""
    policy = _policy(agent, approval) if agent is not None else None
    return policy is not None and policy.required_approvals > 1


async def check_may_decide(
    agent: Agent, approval: PendingApproval, approver: Approver | None
) -> Assignment:
    """Raise :class:`ApprovalRefusedError` when the approval's assignment excludes
    ``approver``; the assignment otherwise."""
    assignment = await current_assignment(agent, approval)
    if not may_act(approver, assignment, quorum=needs_quorum(agent, approval)):
        raise _refuse(approver, assignment)
    return assignment


def _policy(agent: Agent, approval: PendingApproval) -> ApprovalPolicy | None:
    policy = getattr(agent.tools.get(approval.interrupt), "approval_policy", None)
    return policy if isinstance(policy, ApprovalPolicy) else None


def _check_policy(
    agent: Agent, approval: PendingApproval, approver: Approver | None, *, taking: bool
) -> None:
    """The interrupt's approval policy, for acting on the approval without deciding it.
    ``taking`` (a claim, an assignment): the act of someone who may approve, so under
    maker-checker the requester may not claim her own request or route it to a checker she
    picks; she may still deny it, or release what she holds."""
    policy = _policy(agent, approval)
    if policy is not None:
        policy.check(approver, requester=approval.owner, approving=taking)


def check_target(
    agent: Agent, approval: PendingApproval, assignee: str | None, group: str | None
) -> None:
    """Refuse an assignment to someone the interrupt's policy would refuse, so an approval
    cannot be hidden from every inbox: the requester under maker-checker, a person the
    policy refuses whatever roles they hold, a group whose role the policy does not admit.
    What the policy cannot tell (who exists, who holds a role) is not checked."""
    policy = _policy(agent, approval)
    if policy is None:
        return
    if assignee is not None:
        if not policy.requester_may_approve and same_principal(assignee, approval.owner):
            raise ApprovalRefusedError(
                f"'{assignee}' asked for this approval and may not approve it (maker-checker): "
                "it cannot be assigned to them."
            )
        if policy.approvers is not None and not policy.approvers(_Candidate(assignee)):
            raise ApprovalRefusedError(
                f"'{assignee}' may not decide this approval (approvers: {policy.who()}): it "
                "cannot be assigned to them."
            )
    if group is not None and not policy.admits_group(group):
        raise ApprovalRefusedError(
            f"Members of group '{group}' may not decide this approval (approvers: "
            f"{policy.who()}): it cannot be assigned to that group."
        )


class _AnyRole(frozenset[str]):
    """The roles of a person the engine knows only by id: every role, so a policy refuses
    them only if no role would let them decide."""

    def __contains__(self, item: object) -> bool:
        return True


@dataclass(frozen=True)
class _Candidate:
    """Someone an approval would be assigned to, as a policy's predicate sees them."""

    id: str
    roles: frozenset[str] = field(default_factory=_AnyRole)


async def _change(
    agent: Agent, approval: PendingApproval, change: AssignmentChange
) -> Assignment | None:
    store = agent.store
    if store is None:
        raise FailedPreconditionError(
            f"Agent '{agent.name}' keeps no store: it holds no approvals to assign."
        )
    return await store.change_assignment(
        approval.turn_id,
        approval.round,
        approval.ref,
        change,
        default_group=_default_group(agent, approval.interrupt),
    )


async def claim(
    agent: Agent,
    approval: PendingApproval,
    approver: Approver | None,
    *,
    operator: bool = False,
) -> Assignment:
    """``approver`` takes ``approval`` (its assignee becomes ``approver``; the group stays).

    Raises :class:`ApprovalRefusedError` when ``approver`` may not decide it (not checked for
    the ``operator`` CLI, whose users hold the database itself), :class:`ApprovalClaimedError`
    when another person holds it, and :class:`~engine.errors.ApprovalNotPendingError` when it
    is no longer open.
    """
    if approver is None:
        raise ApprovalRefusedError("Claiming an approval needs an authenticated approver.")
    if not operator:
        _check_policy(agent, approval, approver, taking=True)
        await check_may_decide(agent, approval, approver)
    claimed = await _change(agent, approval, AssignmentChange(action="claim", by=approver.id))
    if claimed is None:
        holder = await current_assignment(agent, approval)
        raise ApprovalClaimedError(
            f"This approval is claimed by {holder.assignee or 'someone else'}: they release it, "
            "or someone allowed to decide it reassigns it."
        )
    logger.info("approval %s:%s claimed by %s", approval.turn_id, approval.ref, approver.id)
    return claimed


async def assign(
    agent: Agent,
    approval: PendingApproval,
    *,
    by: Approver | None,
    assignee: str | None = None,
    group: str | None = None,
    operator: str | None = None,
) -> Assignment:
    """Assign ``approval`` to ``assignee`` and/or ``group`` (see the module's rules).

    ``by`` must be allowed to decide the approval; ``operator`` (a name, for the audit) skips
    that check for the operator CLI, whose users hold the database itself.
    """
    if assignee is None and group is None:
        raise InvalidArgumentError("Assign to a person, a group, or both.")
    actor = _actor(agent, approval, by, operator, taking=True)
    if not operator:
        await check_may_decide(agent, approval, by)
        check_target(agent, approval, assignee, group)
    change = AssignmentChange(action="assign", by=actor, assignee=assignee, group=group)
    assigned = await _change(agent, approval, change)
    assert assigned is not None  # an assignment has no guard beyond the approval being open
    logger.info(
        "approval %s:%s assigned to %s by %s",
        approval.turn_id,
        approval.ref,
        assigned.describe(),
        actor,
    )
    return assigned


async def release(
    agent: Agent,
    approval: PendingApproval,
    *,
    by: Approver | None,
    operator: str | None = None,
) -> Assignment:
    """Hand ``approval`` back to its group: its assignee ``by`` (or an ``operator``, whoever
    holds it) lets it go. Raises :class:`ApprovalRefusedError` when ``by`` does not hold it."""
    actor = _actor(agent, approval, by, operator)
    holder = None if operator else actor
    change = AssignmentChange(action="release", by=actor, holder=holder)
    released = await _change(agent, approval, change)
    if released is None:
        raise ApprovalRefusedError(
            f"'{actor}' does not hold this approval: only its assignee releases it."
        )
    logger.info("approval %s:%s released by %s", approval.turn_id, approval.ref, actor)
    return released


def _actor(
    agent: Agent,
    approval: PendingApproval,
    by: Approver | None,
    operator: str | None,
    *,
    taking: bool = False,
) -> str:
    if operator:
        return operator
    if by is None:
        raise ApprovalRefusedError("Changing an assignment needs an authenticated approver.")
    _check_policy(agent, approval, by, taking=taking)
    return by.id


async def sweep_assignments(
    engine: Engine, store: SessionStore, *, now: datetime | None = None, limit: int = 100
) -> SweepReport:
    """Escalate the overdue approvals of ``store`` and remind about those open too long.

    Each change is guarded in the store: running the sweep on several workers at once
    escalates each approval once and reminds once per interval.
    """
    moment = now or datetime.now(UTC)
    report = SweepReport()
    for agent in engine.agents.values():
        if agent.store is not store:
            continue
        for tool in agent.tools.values():
            chain = getattr(tool, "escalation", None)
            if chain is not None:
                await _escalate_due(agent, store, tool.name, chain, moment, limit, report)
            every = getattr(tool, "remind_every", None)
            if every is not None:
                await _remind_due(agent, store, tool.name, every, moment, limit, report)
    return report


async def _escalate_due(
    agent: Agent,
    store: AssignmentBook,
    interrupt: str,
    chain: EscalationChain,
    now: datetime,
    limit: int,
    report: SweepReport,
) -> None:
    for reached in range(len(chain)):
        cutoff = chain.due_cutoff(reached, now)
        query = DueQuery(
            agents=(agent.name,),
            interrupt=interrupt,
            created_before=cutoff,
            escalation_step=reached,
            escalated_before=cutoff if reached else None,
            limit=limit,
        )
        target = chain.groups[reached]
        change = AssignmentChange(
            action="escalate", by=ESCALATION_ACTOR, group=target, from_step=reached, at=now
        )
        for approval in await store.list_due_approvals(query):
            # Escalation heard by the interrupt's webhooks and the new group's.
            hooks = change_deliveries(
                agent, approval, "escalated", at=now, group=target, details={"escalated_to": target}
            )
            try:
                moved = await _change(
                    agent, approval, change.model_copy(update={"deliveries": hooks})
                )
            except AgentError as error:  # decided meanwhile
                logger.info(
                    "escalation of %s:%s skipped: %s", approval.turn_id, approval.ref, error
                )
                continue
            if moved is None:
                continue  # another worker moved it first
            report.escalated.append(moved)
            instruments.approval_escalated(agent.name)
            logger.warning(
                "approval %s:%s escalated from %s to group %s (step %d of %d)",
                approval.turn_id,
                approval.ref,
                moved.escalated_from_assignee or moved.escalated_from_group or "nobody",
                target,
                moved.escalation_step,
                len(chain),
                extra=_fields(approval, moved),
            )


async def _remind_due(
    agent: Agent,
    store: AssignmentBook,
    interrupt: str,
    every: float,
    now: datetime,
    limit: int,
    report: SweepReport,
) -> None:
    since = now - timedelta(seconds=every)
    query = DueQuery(
        agents=(agent.name,),
        interrupt=interrupt,
        created_before=since,
        reminded_before=since,
        limit=limit,
    )
    change = AssignmentChange(action="remind", every_seconds=every, at=now)
    for approval in await store.list_due_approvals(query):
        hooks: tuple[WebhookDelivery, ...] = ()
        if agent.webhooks.any:  # a reminder is heard by the group holding the approval now
            holder = await current_assignment(agent, approval)
            hooks = change_deliveries(
                agent, approval, "reminded", at=now, group=holder.group, assignee=holder.assignee
            )
        try:
            reminded = await _change(
                agent, approval, change.model_copy(update={"deliveries": hooks})
            )
        except AgentError:
            continue
        if reminded is None:
            continue  # another worker reminded within this interval
        report.reminded.append(reminded)
        instruments.approval_reminded(agent.name)
        logger.warning(
            "approval %s:%s still open after %s: reminder %d for %s",
            approval.turn_id,
            approval.ref,
            now - approval.created_at,
            reminded.reminders,
            reminded.describe(),
            extra=_fields(approval, reminded),
        )


def _fields(approval: PendingApproval, assignment: Assignment) -> dict[str, Any]:
    """The structured fields of an escalation or reminder line."""
    return {
        "turn_id": approval.turn_id,
        "session_id": approval.session_id,
        "agent": approval.agent,
        "approval_id": f"{approval.turn_id}:{approval.ref}",
        "interrupt": approval.interrupt,
        "assignee": assignment.assignee,
        "assigned_group": assignment.group,
        "reminders": assignment.reminders,
        "escalation_step": assignment.escalation_step,
    }
