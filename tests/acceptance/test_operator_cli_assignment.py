"""``turnstile approvals claim|assign|release`` and the assignment columns of ``approvals ls``,
as a shell user runs them against a real worker's paused turn, on PostgreSQL and SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.operator_support import operator_database


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_claim_assign_and_release_from_the_shell(kind: str, tmp_path: Path) -> None:
    """A claim is held against another claimant (exit 1), shown by ``ls``; assigning to a
    group clears the person; releasing what nobody holds is refused; usage errors exit 2."""
    async with operator_database(kind, tmp_path) as db:
        with db.worker():
            paused = await db.send("transfer $40 to carol")
            await db.settled(1, statuses=("paused",))
        approval = f"{paused}:approval-1"

        claimed = await db.run_cli(
            "approvals", "claim", approval, "--by", "dave", "--json", app=True
        )
        assert claimed.status == 0, claimed.err
        assert (claimed.json()["assignee"], claimed.json()["assigned_by"]) == ("dave", "dave")
        taken = await db.run_cli("approvals", "claim", approval, "--by", "erin", app=True)
        assert taken.status == 1 and "claimed by dave" in taken.err

        listed = await db.run_cli("approvals", "ls", "--json")
        assert listed.status == 0, listed.err
        [item] = listed.json()["items"]
        assert (item["id"], item["assignee"], item["group"]) == (approval, "dave", None)
        shown = await db.run_cli("approvals", "ls")
        assert "ASSIGNEE" in shown.out and "dave" in shown.out
        detail = await db.run_cli("approvals", "show", approval, "--json")
        assert detail.json()["approval"]["assignee"] == "dave"
        assert "dave (by dave)" in (await db.run_cli("approvals", "show", approval)).out

        moved = await db.run_cli(
            "approvals", "assign", approval, "--group", "leads", "--by", "ops", "--json", app=True
        )
        assert moved.status == 0, moved.err
        assert (moved.json()["assignee"], moved.json()["group"]) == (None, "leads")
        assert moved.json()["assigned_by"] == "ops"
        nobody = await db.run_cli("approvals", "release", approval, "--by", "ops", app=True)
        assert nobody.status == 1 and "only its assignee releases it" in nobody.err

        person = await db.run_cli(
            "approvals", "assign", approval, "--to", "lena", "--by", "ops", app=True
        )
        assert person.status == 0, person.err
        assert "lena (group leads)" in person.out
        freed = await db.run_cli("approvals", "release", approval, "--by", "ops", app=True)
        assert freed.status == 0 and "group leads" in freed.out

        empty = await db.run_cli("approvals", "assign", approval, "--by", "ops", app=True)
        assert empty.status == 2 and "--to NAME, --group ROLE, or both" in empty.err
