"""Escalation chains (engine.escalation): the shapes ``on_timeout={"escalate": ...}``
accepts, the mistakes refused at definition time, which step is due when, and the guard that
moves an approval from one step to the next once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine import Engine, EscalationStep
from engine.approval_policy import ApprovalPolicy, role
from engine.escalation import DueStep, EscalationChain, progress
from engine.remote.ui.present import escalation_summary
from engine.store import Assignment, AssignmentChange
from engine.store.rules import apply_change
from tests.conftest import TEST_STATE_KEYS
from tests.support import ListModel

NOW = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
HOURS_4, HOURS_8 = timedelta(hours=4), timedelta(hours=8)


def define(**arguments: object) -> EscalationChain | None:
    """The escalation chain of an interrupt ``ask`` defined with ``arguments``."""
    ai = Engine(model=ListModel([]), state_keys=TEST_STATE_KEYS)
    return ai.define_interrupt(name="ask", **arguments).escalation  # type: ignore[arg-type]


def test_every_shape_of_a_chain_reads_the_same() -> None:
    """Typed steps, (group, wait) pairs with timedeltas or seconds, and bare groups waiting the
    interrupt's timeout all give the same chain; a single group is a chain of one step."""
    typed = define(
        on_timeout={
            "escalate": [EscalationStep("leads", HOURS_4), EscalationStep("directors", HOURS_8)]
        }
    )
    pairs = define(on_timeout={"escalate": [("leads", HOURS_4), ("directors", 8 * 3600)]})
    mixed = define(timeout=HOURS_4, on_timeout={"escalate": ["leads", ("directors", HOURS_8)]})
    assert typed == pairs == mixed == EscalationChain((("leads", HOURS_4), ("directors", HOURS_8)))
    single = define(timeout=HOURS_4, on_timeout={"escalate": "leads"})
    assert single == EscalationChain((("leads", HOURS_4),))
    assert define(timeout=60, on_timeout="fail") is None


@pytest.mark.parametrize(
    ("on_timeout", "message"),
    [
        ({"escalate": []}, "needs a step"),
        ({"escalate": [("leads", -5)]}, "step 1 must wait a positive time"),
        ({"escalate": [("leads", timedelta(0))]}, "step 1 must wait a positive time"),
        ({"escalate": [("leads", HOURS_4), ("directors", "8h")]}, "step 2 waits a timedelta"),
        ({"escalate": ["leads"]}, "step 1 \\(leads\\) has no wait of its own"),
        ({"escalate": [("leads", HOURS_4, "x")]}, "step 1 is"),
        ({"escalate": [{"group": "leads"}]}, "EscalationStep\\(group, after\\)"),
        ({"escalate": [(" ", HOURS_4)]}, "step 1 must name a group"),
        ({"escalate": [("leads", HOURS_4), ("leads", HOURS_8)]}, "names leads twice"),
        ({"escalate": 42}, "a group or a list of steps"),
        ({"escalate": "leads", "after": 5}, "with nothing else"),
    ],
)
def test_a_bad_chain_is_a_value_error_naming_the_interrupt(
    on_timeout: dict[str, object], message: str
) -> None:
    """Each malformed chain is refused when the interrupt is defined, naming it."""
    with pytest.raises(ValueError, match=message) as refused:
        define(on_timeout=on_timeout)
    assert "Interrupt 'ask'" in str(refused.value)


def test_a_chain_may_only_reach_groups_the_policy_lets_decide() -> None:
    """Under ``approvers=role("leads") | role("directors")``-style policies, a step to a group
    whose members may not decide is refused: the approval would wait where nobody may act."""
    only_leads = ApprovalPolicy(approvers=role("leads"))
    assert define(approvers=only_leads, on_timeout={"escalate": [("leads", HOURS_4)]}) is not None
    with pytest.raises(ValueError, match="Interrupt 'ask' escalates to directors"):
        define(
            approvers=only_leads,
            on_timeout={"escalate": [("leads", HOURS_4), ("directors", HOURS_8)]},
        )


def test_each_step_is_due_after_its_own_wait_from_the_step_before() -> None:
    """Step 1 is due its wait after the creation, step 2 its wait after step 1 actually
    happened (a late sweep never shortens the next group's time); past the last, none."""
    chain = EscalationChain((("leads", HOURS_4), ("directors", HOURS_8)))
    assert chain.next_step(0, NOW) == DueStep(1, "leads", NOW + HOURS_4)
    late = NOW + HOURS_4 + timedelta(minutes=30)
    assert chain.next_step(1, late) == DueStep(2, "directors", late + HOURS_8)
    assert chain.next_step(2, late + HOURS_8) is None
    # The query's cutoff is the same rule turned around.
    assert chain.due_cutoff(1, late + HOURS_8) == late


def test_progress_says_where_the_approval_is_and_what_comes_next() -> None:
    """Open at step 1: step 1 of 2, next directors; at the last step: next none; decided: no
    next step whatever the chain."""
    chain = EscalationChain((("leads", HOURS_4), ("directors", HOURS_8)))
    moved = NOW + HOURS_4
    at_one = progress(chain, 1, created_at=NOW, escalated_at=moved)
    assert at_one.describe(datetime.isoformat) == (
        f"step 1 of 2, next: directors at {(moved + HOURS_8).isoformat()}"
    )
    at_end = progress(chain, 2, created_at=NOW, escalated_at=moved + HOURS_8)
    assert at_end.describe(datetime.isoformat) == "step 2 of 2, next: none"
    decided = progress(chain, 0, created_at=NOW, escalated_at=None, is_open=False)
    assert decided.next is None


def test_an_escalation_moves_only_from_the_step_it_names() -> None:
    """The guard: an escalation from step 0 moves an unescalated approval to step 1 once; a
    second one from step 0 (another worker) is refused; from step 1 it moves on to step 2."""
    start = Assignment(turn_id="t", round=1, ref="r", group="payments")
    first = AssignmentChange(action="escalate", by="escalation", group="leads", from_step=0)
    at_one = apply_change(start, first, NOW)
    assert at_one is not None and (at_one.escalation_step, at_one.group) == (1, "leads")
    assert apply_change(at_one, first, NOW) is None
    second = AssignmentChange(action="escalate", by="escalation", group="directors", from_step=1)
    at_two = apply_change(at_one, second, NOW + HOURS_8)
    assert at_two is not None
    assert (at_two.escalation_step, at_two.group, at_two.escalated_from_group) == (
        2,
        "directors",
        "leads",
    )
    assert apply_change(at_two, second, NOW + HOURS_8) is None


def test_the_history_names_the_step_past_a_chains_first() -> None:
    """A decided approval's escalation reads as before after one step, and names the step
    reached after more."""
    assert escalation_summary("payments", "dave", "leads") == (
        "from group payments (held by dave) to group leads"
    )
    assert escalation_summary("leads", None, "directors", step=2) == (
        "from group leads to group directors (step 2)"
    )
