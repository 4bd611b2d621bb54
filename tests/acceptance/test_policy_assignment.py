"""Assignments that would game an approval policy are refused, against a real ``turnstile
serve`` and worker on PostgreSQL (issue 32): under maker-checker the requester neither claims
her request nor routes it to a checker she picks, an approval is not assigned where its policy
would refuse every decider, and a claim leaves a two-person quorum reachable."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.inbox_ui_support import open_stack
from tests.acceptance.policy_app import TOKENS

pytestmark = pytest.mark.postgres


def test_assignments_that_would_game_the_policy_are_refused(tmp_path: Path) -> None:
    """alice (the requester) may not claim or assign; nobody may assign to alice or to a
    group the policy does not admit; bob's claim does not stop carol's vote, and the two
    votes decide."""
    with open_stack(
        tmp_path,
        app="tests.acceptance.policy_app:ai",
        auth="tests.acceptance.policy_app:auth",
        tokens=TOKENS,
        env={"TURNSTILE_UI_SECRET": "policy-assignment-secret-0123456789abcdef"},
    ) as stack:
        turn_id = stack.ask("Transfer $700 to bob")
        approval = stack.wait_for_approval(turn_id, who="alice")
        assignment = f"/inbox/{approval['id']}/assignment"
        decision = f"/inbox/{approval['id']}/decision"
        yes = {"respond": {"approved": True}}
        with stack.api("alice") as alice:
            assert alice.post(assignment, json={"action": "claim"}).status_code == 403
            routed = alice.post(assignment, json={"action": "assign", "assignee": "carol"})
            assert routed.status_code == 403, routed.text
        with stack.api("bob") as bob:
            to_requester = bob.post(assignment, json={"action": "assign", "assignee": "alice"})
            assert to_requester.status_code == 403, to_requester.text
            to_nowhere = bob.post(assignment, json={"action": "assign", "group": "nobody"})
            assert to_nowhere.status_code == 403, to_nowhere.text
            claimed = bob.post(assignment, json={"action": "claim"})
            assert claimed.status_code == 200, claimed.text
        with stack.api("carol") as carol:
            voted = carol.post(decision, json=yes)
            assert voted.status_code == 200, voted.text
            assert voted.json()["decided"] is False
        with stack.api("bob") as bob:
            decided = bob.post(decision, json=yes)
            assert decided.status_code == 200 and decided.json()["decided"] is True
