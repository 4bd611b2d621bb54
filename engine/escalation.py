"""Escalation chains: where an approval nobody decides moves, step after step.

``define_interrupt(..., on_timeout={"escalate": ...})`` accepts:

* a group: ``{"escalate": "leads"}`` moves the approval to ``leads`` once it has been open
  ``timeout``;
* a chain, a list of steps: ``{"escalate": [EscalationStep("leads", timedelta(hours=4)),
  EscalationStep("directors", timedelta(hours=8))]}``. A step may also be written
  ``("leads", timedelta(hours=4))`` (seconds as a number work too), or as a bare group name,
  which waits ``timeout``.

A step's ``after`` is how long the approval waits where it is before that step moves it: the
first step counts from the approval's creation, every later one from the step before it
(when it actually happened, so a late sweep never shortens the next holder's time). Each step
moves it once; a decided approval moves no further. The store records the step reached and
when, and :func:`next_step` says which step is due next and when: the sweep
(:func:`engine.approvals.assignment.sweep_assignments`) and the pages ask the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.approval_policy import ApprovalPolicy

__all__ = [
    "ESCALATE",
    "DueStep",
    "EscalationChain",
    "EscalationProgress",
    "EscalationStep",
    "escalation_chain",
    "progress",
]

#: The key of ``on_timeout={"escalate": ...}``.
ESCALATE = "escalate"


@dataclass(frozen=True)
class EscalationStep:
    """One step of a chain: after ``after`` (a timedelta, or seconds) where it is, the
    approval moves to ``group``; ``after=None`` waits the interrupt's ``timeout``."""

    group: str
    after: timedelta | float | None = None


@dataclass(frozen=True)
class DueStep:
    """The next step of a chain and when it is due."""

    #: 1 for the first step.
    number: int
    group: str
    due_at: datetime


@dataclass(frozen=True)
class EscalationChain:
    """The groups an unanswered approval moves to, in order, each with its wait."""

    steps: tuple[tuple[str, timedelta], ...]

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def groups(self) -> tuple[str, ...]:
        """The groups of the steps, in order."""
        return tuple(group for group, _ in self.steps)

    def next_step(self, reached: int, since: datetime) -> DueStep | None:
        """The step after step ``reached`` (0: none yet) of an approval that got there at
        ``since`` (its creation, for 0), and when it is due; ``None`` past the last step."""
        if reached >= len(self.steps):
            return None
        group, after = self.steps[reached]
        return DueStep(number=reached + 1, group=group, due_at=since + after)

    def due_cutoff(self, reached: int, now: datetime) -> datetime:
        """The latest moment an approval may have reached step ``reached`` (0: been created)
        for the next step to be due at ``now``: :meth:`next_step` turned around for a query."""
        return now - self.steps[reached][1]


@dataclass(frozen=True)
class EscalationProgress:
    """Where an approval is in its interrupt's chain: what the pages and the CLI say."""

    #: The step reached (0: not escalated) and the chain's length.
    reached: int
    total: int
    #: The next step, when the approval is open and the chain goes on.
    next: DueStep | None

    def describe(self, moment: Callable[[datetime], str | None]) -> str:
        """``"step 2 of 3, next: directors at …"`` (times written by ``moment``)."""
        upcoming = (
            f"{self.next.group} at {moment(self.next.due_at)}" if self.next is not None else "none"
        )
        return f"step {self.reached} of {self.total}, next: {upcoming}"


def progress(
    chain: EscalationChain,
    reached: int,
    *,
    created_at: datetime,
    escalated_at: datetime | None,
    is_open: bool = True,
) -> EscalationProgress:
    """Where an approval created at ``created_at``, at step ``reached`` since
    ``escalated_at``, is in ``chain``; a decided approval has no next step."""
    since = escalated_at if reached and escalated_at is not None else created_at
    upcoming = chain.next_step(reached, since) if is_open else None
    return EscalationProgress(reached=reached, total=len(chain), next=upcoming)


def _seconds(value: Any, where: str) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, (timedelta, int, float)):
        raise ValueError(f"{where} waits a timedelta or a number of seconds, not {value!r}.")
    wait = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if wait <= timedelta(0):
        raise ValueError(f"{where} must wait a positive time, not {value!r}.")
    return wait


def _step(
    raw: Any, number: int, timeout: timedelta | None, interrupt: str
) -> tuple[str, timedelta]:
    where = f"Interrupt '{interrupt}': escalation step {number}"
    if isinstance(raw, str):
        group, after = raw, None
    elif isinstance(raw, EscalationStep):
        group, after = raw.group, raw.after
    elif isinstance(raw, tuple) and len(raw) == 2:
        group, after = raw
    else:
        raise ValueError(
            f"{where} is {raw!r}: write a step as EscalationStep(group, after), "
            "(group, after) or a group name."
        )
    if not isinstance(group, str) or not group.strip():
        raise ValueError(f"{where} must name a group (a role), not {group!r}.")
    if after is None:
        if timeout is None:
            raise ValueError(
                f"{where} ({group}) has no wait of its own: the interrupt needs a timeout, or "
                "the step an 'after'."
            )
        return group, timeout
    return group, _seconds(after, where)


def escalation_chain(
    interrupt: str,
    on_timeout: Any,
    *,
    timeout: float | None,
    policy: ApprovalPolicy | None = None,
) -> EscalationChain | None:
    """The chain ``on_timeout`` asks for (``None``: it does not escalate).

    Raises ``ValueError`` naming ``interrupt`` for a malformed escalation: another key beside
    ``"escalate"``, an empty chain, a step without a group or with no positive wait, a group
    twice, or a group whose members ``policy`` would not let decide (the approval would sit
    where nobody may act on it).
    """
    if not (isinstance(on_timeout, Mapping) and ESCALATE in on_timeout):
        return None
    if len(on_timeout) != 1:
        raise ValueError(
            f"Interrupt '{interrupt}': on_timeout escalates as {{\"escalate\": ...}} with "
            f"nothing else, not {sorted(on_timeout)!r}."
        )
    default_wait = timedelta(seconds=timeout) if timeout is not None else None
    raw = on_timeout[ESCALATE]
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        if not isinstance(raw, str):
            raise ValueError(
                f"Interrupt '{interrupt}': on_timeout escalates to a group or a list of "
                f"steps, not {raw!r}."
            )
        raw = [raw]
    if not raw:
        raise ValueError(f"Interrupt '{interrupt}': an escalation chain needs a step.")
    steps = tuple(_step(item, n, default_wait, interrupt) for n, item in enumerate(raw, 1))
    groups = [group for group, _ in steps]
    repeated = sorted({g for g in groups if groups.count(g) > 1})
    if repeated:
        raise ValueError(
            f"Interrupt '{interrupt}': the escalation chain names {', '.join(repeated)} "
            "twice; each group is one step."
        )
    if policy is not None:
        refused = [g for g in groups if not policy.admits_group(g)]
        if refused:
            raise ValueError(
                f"Interrupt '{interrupt}' escalates to {', '.join(refused)}, whose members "
                f"its approval policy does not let decide (approvers: {policy.who()})."
            )
    return EscalationChain(steps)
