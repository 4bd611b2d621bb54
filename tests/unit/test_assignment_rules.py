"""The pure rules of approval assignment: defining an escalating interrupt, who may act on an
assigned approval, what each inbox filter admits, and each change's guard."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine import Engine
from engine.approvals.assignment import assigned_matches, may_act
from engine.approvals.decide import NamedApprover
from engine.approvals.rules import check_assignment_seen
from engine.remote.wire import http_status
from engine.store import Assignment, AssignmentChange, AssignmentChangedError
from engine.store.rules import apply_change
from tests.conftest import TEST_STATE_KEYS
from tests.support import ListModel

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
DAVE = NamedApprover("dave", frozenset({"payments"}))
LENA = NamedApprover("lena", frozenset({"leads"}))


def held(assignee: str | None = None, group: str | None = None) -> Assignment:
    """An approval's assignment to ``assignee`` and/or ``group``."""
    return Assignment(turn_id="t", round=1, ref="r", assignee=assignee, group=group)


def test_an_escalating_interrupt_has_a_timeout_but_no_expiry() -> None:
    """``on_timeout={"escalate": ...}`` is read as an escalation, not as a default answer, and
    timeouts may be timedeltas."""
    ai = Engine(model=ListModel([]), state_keys=TEST_STATE_KEYS)
    tool = ai.define_interrupt(
        name="ask",
        timeout=timedelta(minutes=5),
        on_timeout={"escalate": "leads"},
        group="payments",
        remind_every=timedelta(minutes=1),
    )
    assert tool.escalation is not None and tool.escalation.groups == ("leads",)
    assert (tool.timeout, tool.on_timeout) == (300.0, None)
    assert tool.expires_after is None
    assert (tool.group, tool.remind_every) == ("payments", 60.0)
    expiring = ai.define_interrupt(name="expiring", timeout=30, on_timeout=False)
    assert (expiring.expires_after, expiring.on_timeout, expiring.escalation) == (
        30.0,
        False,
        None,
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"on_timeout": {"escalate": "leads"}}, "needs a timeout"),
        ({"timeout": 5, "on_timeout": {"escalate": ""}}, "must name a group"),
        ({"timeout": 5, "on_timeout": {"escalate": "leads", "also": 1}}, "nothing else"),
        ({"timeout": 0}, "timeout must be positive"),
        ({"remind_every": timedelta(0)}, "remind_every must be positive"),
        ({"group": " "}, "group must name a group"),
    ],
)
def test_a_bad_definition_is_refused(arguments: dict[str, object], message: str) -> None:
    """Each mistake in an interrupt's timeout, escalation, reminder or group is a ValueError
    naming it, at definition time."""
    ai = Engine(model=ListModel([]), state_keys=TEST_STATE_KEYS)
    with pytest.raises(ValueError, match=message):
        ai.define_interrupt(name="ask", **arguments)  # type: ignore[arg-type]


def test_who_may_act_on_an_assignment() -> None:
    """Nobody assigned: anyone; a group: its members and the assignee; anonymous: only an
    unassigned approval."""
    assert may_act(None, held()) and may_act(LENA, held())
    assert may_act(DAVE, held(group="payments")) and not may_act(LENA, held(group="payments"))
    assert may_act(LENA, held(group="payments", assignee="lena"))
    assert not may_act(DAVE, held(assignee="lena"))
    assert not may_act(None, held(group="payments"))


def test_the_inbox_filters() -> None:
    """Mine, my groups, unassigned, and everything I may act on; an open server sees all."""
    mine = held(assignee="dave", group="payments")
    theirs = held(group="leads")
    nobody = held()
    assert [assigned_matches(DAVE, a, None) for a in (mine, theirs, nobody)] == [1, 0, 1]
    assert [assigned_matches(DAVE, a, "me") for a in (mine, theirs, nobody)] == [1, 0, 0]
    assert [assigned_matches(DAVE, a, "groups") for a in (mine, theirs, nobody)] == [1, 0, 0]
    assert [assigned_matches(DAVE, a, "unassigned") for a in (mine, theirs, nobody)] == [0, 0, 1]
    assert assigned_matches(None, theirs, None)


def test_each_change_and_its_guard() -> None:
    """A claim holds against others; release needs the holder; assigning a group clears the
    person; an escalation happens once and records where from; a reminder once per interval."""
    start = held(group="payments")
    claimed = apply_change(start, AssignmentChange(action="claim", by="dave"), NOW)
    assert claimed is not None and (claimed.assignee, claimed.group) == ("dave", "payments")
    assert apply_change(claimed, AssignmentChange(action="claim", by="erin"), NOW) is None
    assert apply_change(claimed, AssignmentChange(action="release", holder="erin"), NOW) is None
    freed = apply_change(claimed, AssignmentChange(action="release", holder="dave"), NOW)
    assert freed is not None and freed.assignee is None and freed.group == "payments"

    person = apply_change(start, AssignmentChange(action="assign", assignee="ann"), NOW)
    assert person is not None and (person.assignee, person.group) == ("ann", "payments")
    group = apply_change(person, AssignmentChange(action="assign", group="leads"), NOW)
    assert group is not None and (group.assignee, group.group) == (None, "leads")

    escalate = AssignmentChange(action="escalate", by="escalation", group="leads")
    moved = apply_change(claimed, escalate, NOW)
    assert moved is not None
    assert (moved.group, moved.assignee, moved.escalated_at) == ("leads", None, NOW)
    assert (moved.escalated_from_group, moved.escalated_from_assignee) == ("payments", "dave")
    assert apply_change(moved, escalate, NOW + timedelta(hours=1)) is None

    remind = AssignmentChange(action="remind", every_seconds=60)
    first = apply_change(start, remind, NOW)
    assert first is not None and first.reminders == 1
    assert apply_change(first, remind, NOW + timedelta(seconds=59)) is None
    second = apply_change(first, remind, NOW + timedelta(seconds=60))
    assert second is not None and second.reminders == 2


def test_what_a_decision_checks_of_the_assignment_it_saw() -> None:
    """A decision checked against an assignment is refused (409) once a claim, release,
    reassignment or escalation changed it, but not by a reminder, and an approval nobody
    assigned yet matches its default whether or not a reminder stored a row for it."""
    default = held(group="payments")
    reminded = apply_change(default, AssignmentChange(action="remind", every_seconds=60), NOW)
    assert reminded is not None
    check_assignment_seen("t", "r", default, None)
    check_assignment_seen("t", "r", default, reminded)
    claimed = apply_change(reminded, AssignmentChange(action="claim", by="dave"), NOW)
    assert claimed is not None
    with pytest.raises(AssignmentChangedError, match="dave") as refused:
        check_assignment_seen("t", "r", default, claimed)
    assert http_status(refused.value) == 409
    changes = [
        AssignmentChange(action="release", by="dave"),
        AssignmentChange(action="assign", by="dave", group="leads"),
        AssignmentChange(action="escalate", by="escalation", group="leads"),
    ]
    for later, change in enumerate(changes, start=1):
        changed = apply_change(claimed, change, NOW + timedelta(seconds=later))
        assert changed is not None
        with pytest.raises(AssignmentChangedError):
            check_assignment_seen("t", "r", claimed, changed)
    remind_later = AssignmentChange(action="remind", every_seconds=60)
    again = apply_change(claimed, remind_later, NOW + timedelta(minutes=2))
    assert again is not None
    check_assignment_seen("t", "r", claimed, again)
