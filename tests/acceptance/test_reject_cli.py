"""``turnstile approvals reject`` as a shell user runs it, against a real ``turnstile worker``
on PostgreSQL: ``deny`` on a tool that paused itself points at ``reject``, a reject without a
reason is a usage error, and a reject with one books nothing while the worker's resume tells
the model, which reports the refusal."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from engine.status import FinishReason, TurnStatus
from examples.banking import read_ledger
from stores import SqlSessionStore
from tests.acceptance.test_edit_before_approve_cli import APP, cli, paused_approval
from tests.databases import postgres_url
from tests.http_support import worker_process

pytestmark = pytest.mark.postgres


async def final_answer(url: str, turn_id: str) -> tuple[TurnStatus, str]:
    """The resume turn's status once settled, and the text the model ended it with."""
    store = SqlSessionStore(url)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            turn = await store.get_turn(turn_id)
            if turn is not None and turn.status is not TurnStatus.PENDING:
                assert turn.finish_reason is FinishReason.STOP
                return turn.status, (await store.load_conversation(turn_id))[-1].text
            await asyncio.sleep(0.1)
        raise AssertionError("the worker never finished the resume")
    finally:
        await store.close()


def test_reject_from_the_cli(tmp_path: Path) -> None:
    """Refusals first (deny on a self-guarding tool, an empty reason), then a reject that the
    worker answers with a refusal: nothing is booked and the model says why."""
    ledger = tmp_path / "ledger.jsonl"
    with postgres_url() as url, worker_process(url, app=APP, env={"TURNSTILE_LEDGER": str(ledger)}):
        approval = asyncio.run(paused_approval(url))

        denied = cli(url, "approvals", "deny", approval, "--by", "bob")
        assert denied.returncode == 2, denied.stderr
        assert "turnstile approvals reject" in denied.stderr
        empty = cli(url, "approvals", "reject", approval, "--by", "bob", "--reason", "  ")
        assert empty.returncode == 2 and "--reason" in empty.stderr, empty.stderr
        missing = cli(url, "approvals", "reject", approval, "--by", "bob")
        assert missing.returncode == 2 and "--reason" in missing.stderr

        done = cli(
            url,
            "approvals",
            "reject",
            approval,
            "--by",
            "bob",
            "--reason",
            "Carol is not a known payee.",
            "--json",
        )
        assert done.returncode == 0, done.stderr
        decided = json.loads(done.stdout)
        assert decided["decided"] is True and decided["decided_by"] == "bob"
        assert decided["answer"]["reject"]["reason"] == "Carol is not a known payee."
        assert decided["answer"]["reject"]["by"] == "bob"
        assert decided["resume_turn_id"]

        status, text = asyncio.run(final_answer(url, decided["resume_turn_id"]))
        assert (status, text) == (
            TurnStatus.COMPLETED,
            "The transfer was rejected: Carol is not a known payee.",
        )
        assert read_ledger(ledger) == []
        again = cli(url, "approvals", "reject", approval, "--by", "carol", "--reason", "again")
        assert again.returncode == 1, again.stderr
        shown = cli(url, "approvals", "show", approval)
        assert shown.returncode == 0, shown.stderr
        assert "Carol is not a known payee." in shown.stdout
