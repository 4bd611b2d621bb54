"""``inbox_policy_from_spec``: ``owner``, ``role:NAME`` and ``module:attr`` (imported from the
current directory), and a ValueError listing the forms for anything else."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from engine.remote.auth import (
    InboxPolicy,
    OwnerInboxPolicy,
    Principal,
    RoleInboxPolicy,
    inbox_policy_from_spec,
)
from engine.store import PendingApproval

FORMS = ("'owner'", "'role:NAME'", "'module:attribute'")

POLICY_MODULE = """
from engine.remote.auth import RoleInboxPolicy


class AuditorsDecideAll(RoleInboxPolicy):
    def __init__(self) -> None:
        super().__init__(role="auditor")


def make_policy() -> RoleInboxPolicy:
    return RoleInboxPolicy(role="treasurer")


def needs_arguments(role: str) -> RoleInboxPolicy:
    return RoleInboxPolicy(role=role)


ready = RoleInboxPolicy(role="ready-made")
not_a_policy = 42
"""


@pytest.fixture
def policy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module of policies in a fresh current directory (not on sys.path beforehand)."""
    name = f"policies_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(POLICY_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield name
    sys.modules.pop(name, None)


def _approval(owner: str) -> PendingApproval:
    now = datetime.now(UTC)
    return PendingApproval(
        turn_id="t1",
        session_id="s1",
        agent="bankingAgent",
        owner=owner,
        round=0,
        ref="approval-1",
        interrupt="userApproval",
        input={},
        metadata=None,
        deadline=None,
        created_at=now,
    )


def _role(policy: InboxPolicy) -> str:
    assert isinstance(policy, RoleInboxPolicy)
    return policy.role


def test_owner() -> None:
    policy = inbox_policy_from_spec("owner")
    assert type(policy) is OwnerInboxPolicy
    assert policy.can_decide(Principal("alice"), _approval("alice"))
    assert not policy.can_decide(Principal("bob"), _approval("alice"))


def test_role() -> None:
    policy = inbox_policy_from_spec("role:approver")
    assert _role(policy) == "approver"
    carol = Principal("carol", roles=frozenset({"approver"}))
    assert policy.can_decide(carol, _approval("alice"))
    assert policy.owner_filter(carol) is None
    assert not policy.can_decide(Principal("bob"), _approval("alice"))


def test_a_ready_made_policy_object(policy_module: str) -> None:
    assert _role(inbox_policy_from_spec(f"{policy_module}:ready")) == "ready-made"


def test_a_class_is_instantiated(policy_module: str) -> None:
    assert _role(inbox_policy_from_spec(f"{policy_module}:AuditorsDecideAll")) == "auditor"


def test_a_factory_is_called(policy_module: str) -> None:
    assert _role(inbox_policy_from_spec(f"{policy_module}:make_policy")) == "treasurer"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("", "is not one of"),
        ("owners", "is not one of"),
        ("role:", "names no usable role"),
        ("role:two words", "names no usable role"),
        (":attr", "is not one of"),
        ("module:", "is not one of"),
        ("no_such_module_0f3a:policy", "cannot import module 'no_such_module_0f3a'"),
    ],
)
def test_bad_specs_list_the_forms(spec: str, problem: str) -> None:
    with pytest.raises(ValueError) as refused:
        inbox_policy_from_spec(spec)
    message = str(refused.value)
    assert problem in message
    assert all(form in message for form in FORMS), message


@pytest.mark.parametrize(
    ("attribute", "problem"),
    [
        ("missing", "has no attribute 'missing'"),
        ("not_a_policy", "is a int, which has no owner_filter and can_decide"),
        ("needs_arguments", "could not be made without arguments"),
    ],
)
def test_bad_attributes_list_the_forms(policy_module: str, attribute: str, problem: str) -> None:
    with pytest.raises(ValueError) as refused:
        inbox_policy_from_spec(f"{policy_module}:{attribute}")
    assert problem in str(refused.value)
    assert all(form in str(refused.value) for form in FORMS)
