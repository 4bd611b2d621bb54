"""Approval policies of an interrupt: who may decide it, and how many must approve.

``define_interrupt(..., approvers=..., required_approvals=N)`` attaches an
:class:`ApprovalPolicy` to the interrupt; :func:`engine.approvals.decide.decide` enforces it for
every decision path (the JSON inbox, the web pages, the CLI), so a page or a client cannot skip it.

* **Who may decide.** ``approvers`` is a predicate over the deciding principal (anything with
  ``id`` and ``roles``, such as :class:`engine.remote.auth.Principal`), or a policy object.
  :func:`role` and :func:`principals` build the common predicates.
* **Maker-checker.** When a policy requires approvers, the principal who started the turn (the
  session's owner) may not approve it; it may still deny its own request if the predicate
  allows it. An anonymous caller cannot decide such an interrupt at all: it cannot be told
  apart from the requester.
* **Quorum.** ``required_approvals=N``: N distinct approvers must approve before the recorded
  decision is written and the turn resumes. Any vote that is not an approval — a denial, or a
  restart (which asks again) — decides at once. Each vote is recorded (who, when, answer).
* **Denial.** An answer is a denial when :meth:`ApprovalPolicy.is_denial` says so: by default
  an output of ``false``, or an object whose ``approved`` field is ``false``. A policy built
  with ``denies=`` uses its own rule. A reject (``{"reject": {"reason": ...}}``) is always a
  denial: it decides at once, and the requester may reject her own request.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.conversation.parts import Part
from engine.errors import AgentError
from engine.store import ToolCallRecord

if TYPE_CHECKING:
    pass

__all__ = [
    "ApprovalPolicy",
    "ApprovalRefusedError",
    "Approver",
    "ApproverCheck",
    "check_decided_by_inbox",
    "default_is_denial",
    "identity_key",
    "policy_of",
    "principals",
    "role",
    "same_principal",
]


class Approver(Protocol):
    """Who decides: a principal's id and roles (:class:`engine.remote.auth.Principal` fits)."""

    @property
    def id(self) -> str: ...

    @property
    def roles(self) -> frozenset[str]: ...


#: ``(approver) -> bool``: whether this principal may decide the interrupt.
ApproverCheck = Callable[[Approver], bool]


class ApprovalRefusedError(AgentError):
    """The policy of the interrupt does not let this principal decide it (HTTP 403)."""

    default_status = "PERMISSION_DENIED"


def default_is_denial(output: Any) -> bool:
    """The default denial rule: ``false``, or an object whose ``approved`` field is ``false``."""
    if output is False:
        return True
    return isinstance(output, dict) and output.get("approved") is False


def role(name: str) -> ApproverCheck:
    """Principals holding role ``name`` may decide."""

    def holds_role(approver: Approver) -> bool:
        return name in approver.roles

    holds_role.__doc__ = f"role:{name}"
    return holds_role


def principals(*ids: str) -> ApproverCheck:
    """Only the named principals may decide."""
    allowed = frozenset(ids)

    def is_named(approver: Approver) -> bool:
        return approver.id in allowed

    is_named.__doc__ = "principals:" + ",".join(sorted(allowed))
    return is_named


@dataclass(frozen=True)
class ApprovalPolicy:
    """Who may decide an interrupt, and how many approvals resume the turn.

    ``approvers`` (``None``: anyone the inbox lets see the approval) is a predicate over the
    deciding principal; ``required_approvals`` distinct approvals are needed;
    ``requester_may_approve`` lifts the maker-checker rule; ``denies`` replaces the default
    denial rule (:func:`default_is_denial`); ``description`` is what pages show as "who may
    vote" (derived from the predicate when not given).
    """

    approvers: ApproverCheck | None = None
    required_approvals: int = 1
    requester_may_approve: bool = False
    denies: Callable[[Any], bool] = default_is_denial
    description: str = field(default="")

    def __post_init__(self) -> None:
        if self.required_approvals < 1:
            raise ValueError("required_approvals must be at least 1.")

    def who(self) -> str:
        """A readable description of who may vote."""
        if self.description:
            return self.description
        if self.approvers is None:
            return "anyone allowed to see the approval"
        named = self.approvers.__doc__ or getattr(self.approvers, "__name__", None)
        return str(named or "").strip() or "principals the interrupt's predicate accepts"

    def is_denial(self, answer: dict[str, Any]) -> bool:
        """Whether a journal answer (``{"respond": ...}`` / ``{"restart": ...}`` /
        ``{"reject": ...}``) denies: a reject always does."""
        if "reject" in answer:
            return True
        return "respond" in answer and bool(self.denies(answer["respond"]))

    def may_vote(
        self,
        approver: Approver | None,
        *,
        requester: str | None,
        voted: Collection[str] = (),
    ) -> bool:
        """Whether ``approver`` may still cast an approving vote."""
        try:
            self.check(approver, requester=requester, approving=True)
        except ApprovalRefusedError:
            return False
        return approver is not None and not any(same_principal(approver.id, v) for v in voted)

    def admits_group(self, group: str) -> bool:
        """Whether the members of ``group`` (holders of that role) may decide, whoever they
        are: what an assignment or an escalation to the group needs."""
        return self.approvers is None or self.approvers(_GroupMember(roles=frozenset({group})))

    def check(self, approver: Approver | None, *, requester: str | None, approving: bool) -> None:
        """Raise :class:`ApprovalRefusedError` when ``approver`` may not cast this vote."""
        if approver is None:
            raise ApprovalRefusedError(
                "This approval has an approval policy: it needs an authenticated approver."
            )
        if self.approvers is not None and not self.approvers(approver):
            raise ApprovalRefusedError(
                f"'{approver.id}' may not decide this approval (approvers: {self.who()})."
            )
        if approving and not self.requester_may_approve and same_principal(approver.id, requester):
            raise ApprovalRefusedError(
                f"'{approver.id}' started this turn and may not approve it: another approver "
                "must (maker-checker)."
            )


@dataclass(frozen=True)
class _GroupMember:
    """Any member of a group, as a policy's predicate sees them: known by role alone."""

    roles: frozenset[str]
    id: str = ""


def identity_key(principal_id: str) -> str:
    """The form of a principal id that tells people apart: NFKC-normalised and case-folded,
    so ``Bob``, ``bob`` and ``bob`` in full-width letters are one person to maker-checker and
    to a quorum (an authenticator that issued several would otherwise let one person count
    twice, or approve their own request). Only rules that refuse use it: an assignment to
    ``bob`` is still held by ``bob`` alone, not by an account that looks like him."""
    return unicodedata.normalize("NFKC", principal_id).casefold()


def same_principal(one: str | None, other: str | None) -> bool:
    """Whether two principal ids name the same person (see :func:`identity_key`)."""
    return one is not None and other is not None and identity_key(one) == identity_key(other)


def policy_of(
    approvers: ApprovalPolicy | ApproverCheck | None, required_approvals: int | None
) -> ApprovalPolicy | None:
    """The policy ``define_interrupt``'s arguments describe (``None``: no policy)."""
    if isinstance(approvers, ApprovalPolicy):
        if required_approvals is not None and required_approvals != approvers.required_approvals:
            raise ValueError(
                "Give required_approvals either on the ApprovalPolicy or to define_interrupt."
            )
        return approvers
    if approvers is None and (required_approvals is None or required_approvals == 1):
        return None
    required = 1 if required_approvals is None else required_approvals
    return ApprovalPolicy(approvers=approvers, required_approvals=required)


def check_decided_by_inbox(
    paused: Sequence[Part], journal: Sequence[ToolCallRecord], tools: Mapping[str, object]
) -> None:
    """Refuse a resume that answers an interrupt with an approval policy directly.

    Such an interrupt is answered only from the decision its votes recorded (the inbox's
    resume carries exactly that answer); a chat client resuming on its own would skip the
    policy. Raises :class:`ApprovalRefusedError` naming the inbox.
    """
    # By ref alone, as the resume matches its rows: a migration may rename a paused call.
    decided = {row.ref for row in journal if row.decided_at is not None}
    for part in paused:
        request = part.tool_request
        if request is None or getattr(tools.get(request.name), "approval_policy", None) is None:
            continue
        if str(request.ref) not in decided:
            raise ApprovalRefusedError(
                f"Interrupt '{request.name}' (ref: {request.ref}) has an approval policy: it is "
                "decided through the inbox (POST /inbox/{id}/decision), not by a resume."
            )
