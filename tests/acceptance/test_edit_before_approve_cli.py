"""``turnstile approvals approve --edit`` as a shell user runs it, against a real ``turnstile
worker`` on PostgreSQL: bad edits are refused with exit status 2 and record nothing; a valid
one is recorded with its diff and the worker transfers the edited amount once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.approvals.decide import find_approval
from engine.conversation.parts import Message
from engine.store import TurnInput
from engine.turns.request import TurnRequest
from examples.banking import read_ledger
from examples.guarded_banking import build
from stores import SqlSessionStore
from tests.databases import postgres_url
from tests.http_support import DEPLOYABLE_STATE_KEYS, ROOT, worker_process

pytestmark = pytest.mark.postgres

APP = "examples.guarded_banking:ai"


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``turnstile <args> --db url`` as a process (``TURNSTILE_APP`` names the app)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env.update(
        TURNSTILE_STATE_KEYS=DEPLOYABLE_STATE_KEYS,
        TURNSTILE_APP=APP,
        PYTHONPATH=str(ROOT),
        COLUMNS="250",
    )
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args, "--db", url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def paused_approval(url: str) -> str:
    """Queue alice's transfer of $40 to carol; the approval id once the worker paused it."""
    store = SqlSessionStore(url)
    try:
        app = build(store=store)
        response = await app.agent.run_turn(
            TurnRequest(
                input=TurnInput(kind="message", message=Message.user("transfer $40 to carol")),
                owner="alice",
            ),
            wait=False,
        )
        assert response.snapshot_id is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = await find_approval(store, response.snapshot_id, "transfer-1")
            if found is not None and found[1]:
                return f"{response.snapshot_id}:transfer-1"
            await asyncio.sleep(0.1)
        raise AssertionError("the worker never paused the transfer")
    finally:
        await store.close()


def test_approve_with_edit_from_the_cli(tmp_path: Path) -> None:
    """Refusals first (schema, deny with an edit, an edit that is no object), then the edit
    that the worker carries out."""
    ledger = tmp_path / "ledger.jsonl"
    with postgres_url() as url, worker_process(url, app=APP, env={"TURNSTILE_LEDGER": str(ledger)}):
        approval = asyncio.run(paused_approval(url))

        schema = cli(
            url, "approvals", "approve", approval, "--by", "bob", "--edit", '{"amount": "x"}'
        )
        assert schema.returncode == 2 and "input schema" in schema.stderr, schema.stderr
        denied = cli(url, "approvals", "deny", approval, "--by", "bob", "--edit", '{"amount": 5}')
        assert denied.returncode == 2 and "--edit goes with approve" in denied.stderr
        listed = cli(url, "approvals", "approve", approval, "--by", "bob", "--edit", "[1]")
        assert listed.returncode == 2 and "JSON object" in listed.stderr
        assert read_ledger(ledger) == []

        done = cli(
            url,
            "approvals",
            "approve",
            approval,
            "--by",
            "bob",
            "--edit",
            '{"amount": 500}',
            "--json",
        )
        assert done.returncode == 0, done.stderr
        decided = json.loads(done.stdout)
        assert decided["answer"]["edit"]["diff"] == [{"field": "amount", "old": 40, "new": 500}]
        assert decided["answer"]["edit"]["by"] == "bob" and decided["resume_turn_id"]

        deadline = time.monotonic() + 60
        while not read_ledger(ledger) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [(t["amount"], t["toAccount"]) for t in read_ledger(ledger)] == [(500, "carol")]
        shown = cli(url, "approvals", "show", approval)
        assert shown.returncode == 0, shown.stderr
        assert "amount: 40 → 500 (by bob at" in shown.stdout
