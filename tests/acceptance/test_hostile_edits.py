"""Edits a schema does not allow, sent to a real ``turnstile serve`` on PostgreSQL: a field
the tool's input does not declare, and a number JSON cannot hold, are refused with 400
before anything is recorded (issue 31, item 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.inbox_ui_support import open_edit_stack

pytestmark = pytest.mark.postgres


def test_an_edit_outside_the_schema_or_not_finite_is_a_400_recording_nothing(
    tmp_path: Path,
) -> None:
    """bob's edits adding a field, or setting the amount to 1e309 (infinity once parsed),
    are 400; the approval stays open and undecided, and a valid edit still goes through."""
    with open_edit_stack(tmp_path, secret="hostile-edits-secret-0123456789abcdefgh") as stack:
        turn_id = stack.ask("Transfer $40 to carol")
        approval = stack.wait_for_approval(turn_id, who="bob")
        path = f"/inbox/{approval['id']}/decision"
        with stack.api("bob") as bob:
            extra = bob.post(path, json={"restart": True, "edit": {"amount": 50, "memo": "x"}})
            assert extra.status_code == 400, extra.text
            assert "memo" in extra.json()["message"]
            huge = bob.post(
                path,
                content=b'{"restart": true, "edit": {"amount": 1e309}}',
                headers={"content-type": "application/json"},
            )
            assert huge.status_code == 400, huge.text
            assert "finite" in huge.json()["message"]
            shown = bob.get(f"/inbox/{approval['id']}")
            assert shown.status_code == 200
            assert shown.json().get("decidedBy") is None
            fine = bob.post(path, json={"restart": True, "edit": {"amount": 50}})
            assert fine.status_code == 200, fine.text
