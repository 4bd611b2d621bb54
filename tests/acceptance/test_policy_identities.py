"""Maker-checker and quorum tell people apart by normalised identity, against a real
``turnstile serve`` and worker on PostgreSQL (issue 32): ``Alice`` may not approve alice's
request, and ``bob`` in full-width letters may not add a second vote to bob's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.inbox_ui_support import open_stack
from tests.acceptance.policy_app import TOKENS

pytestmark = pytest.mark.postgres

FULLWIDTH_BOB = "\uff42ob"


def test_ids_differing_in_case_or_width_are_one_person(tmp_path: Path) -> None:
    """Under a two-person quorum that bars the requester: Alice is refused as alice (403),
    the full-width bob as a second vote of bob (409); carol's vote then completes it."""
    with open_stack(
        tmp_path,
        app="tests.acceptance.policy_app:ai",
        auth="tests.acceptance.policy_app:auth",
        tokens=TOKENS,
        env={"TURNSTILE_UI_SECRET": "policy-identities-secret-0123456789abcdef"},
    ) as stack:
        turn_id = stack.ask("Transfer $700 to bob")
        approval = stack.wait_for_approval(turn_id, who="alice")
        path = f"/inbox/{approval['id']}/decision"
        yes = {"respond": {"approved": True}}
        with stack.api("Alice") as lookalike:
            refused = lookalike.post(path, json=yes)
            assert refused.status_code == 403, refused.text
            assert "maker-checker" in refused.json()["message"]
        with stack.api("bob") as bob:
            assert bob.post(path, json=yes).status_code == 200
        with stack.api(FULLWIDTH_BOB) as twin:
            again = twin.post(path, json=yes)
            assert again.status_code == 409, again.text
        assert stack.transfers() == []
        with stack.api("carol") as carol:
            decided = carol.post(path, json=yes)
            assert decided.status_code == 200 and decided.json()["decided"] is True
