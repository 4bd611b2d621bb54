"""The words a turn's history gives each decision: what the approver did (approve, deny,
edit, restart, reject with its reason) and who did it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from engine.store import ToolCallRecord, ToolCallStatus
from engine.store.history import decision_entry

CALL = ToolCallRecord(
    turn_id="t1",
    round=1,
    ref="approval-1",
    name="userApproval",
    status=ToolCallStatus.INTERRUPTED,
    idempotency_key="t1:approval-1",
)
AT = datetime(2026, 12, 6, tzinfo=UTC)


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ({"respond": True}, "approved by bob"),
        ({"respond": {"approved": True}}, "approved by bob"),
        ({"respond": {"approved": False, "feedback": "no"}}, "denied by bob"),
        ({"respond": {"amount": 5}}, "answered by bob"),
        ({"restart": True}, "restarted by bob"),
        ({"restart": True, "edit": {"input": {"amount": 500}}}, "edited and approved by bob"),
        ({"reject": {"reason": "too risky", "by": "bob"}}, "rejected by bob: too risky"),
    ],
)
def test_a_decision_says_what_was_decided_and_by_whom(answer: Any, words: str) -> None:
    """Each kind of answer has its own words, a reject its reason, on the call it decided."""
    entry = decision_entry(CALL, answer, "bob", AT)
    assert (entry.kind, entry.actor, entry.at) == ("decided", "bob", AT)
    assert entry.note == f"userApproval approval-1 {words}"
    assert entry.detail == {
        "round": 1,
        "ref": "approval-1",
        "name": "userApproval",
        "answer": answer,
    }


def test_a_decision_by_nobody_known_says_so() -> None:
    """A decision without a decider (a local resume) is recorded as by unknown."""
    assert decision_entry(CALL, {"respond": True}, None, AT).note.endswith("approved by unknown")
