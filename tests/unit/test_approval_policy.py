"""The approval policy's rules on their own: denials, who may vote, and define_interrupt's
arguments."""

from __future__ import annotations

import pytest

from engine import Engine, ScriptedModel
from engine.approval_policy import (
    ApprovalPolicy,
    ApprovalRefusedError,
    default_is_denial,
    policy_of,
    principals,
    role,
)
from engine.remote.auth import Principal

ANN = Principal("ann", roles=frozenset({"treasurer"}))
BEN = Principal("ben", roles=frozenset({"treasurer"}))
EVE = Principal("eve")


@pytest.mark.parametrize(
    ("output", "denies"),
    [
        (False, True),
        ({"approved": False}, True),
        ({"approved": False, "feedback": "no"}, True),
        (True, False),
        ({"approved": True}, False),
        ({"approved": None}, False),
        ("no", False),
        (0, False),
    ],
)
def test_the_default_denial_rule(output: object, denies: bool) -> None:
    assert default_is_denial(output) is denies


def test_a_restart_is_not_a_denial_and_a_custom_rule_replaces_the_default() -> None:
    policy = ApprovalPolicy(denies=lambda out: out == "reject")
    assert policy.is_denial({"respond": "reject"})
    assert not policy.is_denial({"respond": False})
    assert not ApprovalPolicy().is_denial({"restart": True})


def test_who_may_vote() -> None:
    policy = ApprovalPolicy(approvers=role("treasurer"), required_approvals=2)
    assert policy.who() == "role:treasurer"
    assert policy.may_vote(BEN, requester="ann")
    assert not policy.may_vote(ANN, requester="ann"), "maker-checker"
    assert not policy.may_vote(BEN, requester="ann", voted={"ben"})
    assert not policy.may_vote(EVE, requester="ann")
    assert not policy.may_vote(None, requester="ann")
    policy.check(ANN, requester="ann", approving=False)  # the requester may deny
    with pytest.raises(ApprovalRefusedError, match="maker-checker"):
        policy.check(ANN, requester="ann", approving=True)
    lifted = ApprovalPolicy(approvers=role("treasurer"), requester_may_approve=True)
    lifted.check(ANN, requester="ann", approving=True)
    assert not policy.may_vote(BEN, requester="ann", voted={"Ben"}), "ids differing in case"
    with pytest.raises(ApprovalRefusedError, match="maker-checker"):
        policy.check(ANN, requester="\uff41nn", approving=True)  # full-width a: still ann
    named = ApprovalPolicy(approvers=principals("eve", "ann"))
    assert named.who() == "principals:ann,eve"
    assert named.may_vote(EVE, requester="ann")


def test_define_interrupt_arguments() -> None:
    assert policy_of(None, None) is None
    assert policy_of(None, 1) is None
    quorum = policy_of(None, 2)
    assert quorum is not None and quorum.required_approvals == 2 and quorum.approvers is None
    given = ApprovalPolicy(required_approvals=3)
    assert policy_of(given, None) is given
    with pytest.raises(ValueError, match="either"):
        policy_of(given, 2)
    with pytest.raises(ValueError, match="at least 1"):
        ApprovalPolicy(required_approvals=0)
    with pytest.raises(ValueError, match="at least 1"):
        policy_of(None, 0)
    ai = Engine(model=ScriptedModel())
    interrupt = ai.define_interrupt(name="ask", approvers=role("treasurer"), required_approvals=2)
    assert interrupt.approval_policy is not None
    assert interrupt.approval_policy.required_approvals == 2
    assert ai.define_interrupt(name="plain").approval_policy is None
