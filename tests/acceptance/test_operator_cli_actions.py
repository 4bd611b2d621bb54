"""The operator CLI's actions, as a shell user runs them against a running worker: an
approval decided from the shell that the worker then finishes (and a second decision
refused), a bulk retry of 100 failed turns, abort, fork, and usage errors. Each command is a
real ``turnstile`` process with ``--app``; the turns it creates are run by a real
``turnstile worker`` process, on PostgreSQL and SQLite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from examples.banking import read_ledger
from tests.acceptance.operator_support import ROOT, operator_database

RETRIED_TURNS = 100


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_an_approval_from_the_cli_is_finished_by_the_worker(
    kind: str, tmp_path: Path
) -> None:
    async with operator_database(kind, tmp_path) as db:
        with db.worker():
            paused = await db.send("transfer $40 to carol")
            await db.settled(1, statuses=("paused",))
            approval = f"{paused}:approval-1"

            contradicted = await db.run_cli(
                "approvals", "approve", approval, "--by", "alice",
                "--answer", '{"approved": false}', app=True,
            )  # fmt: skip
            assert contradicted.status == 2
            assert "turnstile approvals deny" in contradicted.err
            invalid = await db.run_cli(
                "approvals", "approve", approval, "--by", "alice",
                "--answer", '{"approved": "yes"}', app=True,
            )  # fmt: skip
            assert invalid.status == 2 and "output schema" in invalid.err

            done = await db.run_cli(
                "approvals", "approve", approval, "--by", "alice", "--json", app=True
            )
            assert done.status == 0, done.err
            decided = done.json()
            assert decided["answer"] == {"respond": {"approved": True}}
            assert decided["decided_by"] == "alice" and decided["waiting_for"] == []
            resume = decided["resume_turn_id"]
            assert resume

            async def finished() -> bool:
                turn = await db.store.get_turn(resume)
                return turn is not None and turn.status.value == "completed"

            await db.wait_for("the resume to complete", finished)

        second = await db.run_cli("approvals", "deny", approval, "--by", "bob", app=True)
        assert second.status == 1
        assert "no longer pending" in second.err and "approvals show" in second.err
        shown = (await db.run_cli("approvals", "show", approval, "--json")).json()["approval"]
        assert shown["decided_by"] == "alice" and shown["state"] == "answered"
        assert shown["answer"] == {"respond": {"approved": True}}
        [booked] = read_ledger(db.ledger)
        assert booked["toAccount"] == "carol"
        resumed = (await db.run_cli("turns", "show", resume, "--json")).json()
        assert resumed["conversation"][-1]["content"][0]["text"] == (
            "Done. Transaction txn-40-carol."
        )
        audit = await db.store.list_calls(paused)
        assert [(c.decided_by, c.status.value) for c in audit] == [("alice", "answered")]


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_a_bulk_retry_of_100_failed_turns(kind: str, tmp_path: Path) -> None:
    async with operator_database(kind, tmp_path) as db:
        db.outage.touch()
        with db.worker():
            originals = {await db.send(f"question {n}") for n in range(RETRIED_TURNS)}
            await db.settled(RETRIED_TURNS, statuses=("failed",))
            db.outage.unlink()

            dry = await db.run_cli(
                "turns", "retry", "--status", "failed", "--since", "1h", "--dry-run", "--json"
            )
            assert dry.status == 0, dry.err
            planned = dry.json()
            assert planned["dry_run"] is True and planned["skipped"] == []
            assert {r["turn_id"] for r in planned["retried"]} == originals
            assert {r["retry_id"] for r in planned["retried"]} == {None}
            assert len(await db.turns()) == RETRIED_TURNS  # a dry run creates nothing

            done = await db.run_cli(
                "turns", "retry", "--status", "failed", "--since", "1h", app=True
            )
            assert done.status == 0, done.err
            assert f"retried {RETRIED_TURNS} turns" in done.out
            assert f"{RETRIED_TURNS}/{RETRIED_TURNS}" in done.err  # the progress bar's count
            retries = await db.settled(RETRIED_TURNS, statuses=("completed",))
        assert {r.parent_id for r in retries} == originals
        assert {r.input_kind for r in retries} == {"retry"}
        assert {r.attempts for r in retries} == {1}
        echoed = (await db.run_cli("turns", "show", retries[0].id, "--json")).json()
        assert echoed["conversation"][-1]["content"][0]["text"].startswith("Echo: question ")

        again = await db.run_cli(
            "turns", "retry", "--status", "failed", "--since", "1h", "--json", app=True
        )
        assert again.status == 0 and again.json()["retried"] == []  # each is continued already
        by_id = await db.run_cli("turns", "retry", next(iter(originals)), "--json", app=True)
        assert by_id.status == 1
        [skipped] = by_id.json()["skipped"]
        assert skipped["reason"].startswith("already continued by ")


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
async def test_abort_retry_by_id_and_fork(kind: str, tmp_path: Path) -> None:
    async with operator_database(kind, tmp_path) as db:
        waiting = await db.send("hello there")  # no worker yet: nobody holds it
        aborted = await db.run_cli("turns", "abort", waiting, "no-such-turn", "--json", app=True)
        assert aborted.status == 1  # one of them was not found
        assert aborted.json()["items"] == [
            {"turn_id": waiting, "status": "aborted", "result": "aborted"},
            {"turn_id": "no-such-turn", "status": None, "result": "not_found"},
        ]
        again = await db.run_cli("turns", "abort", waiting, app=True)
        assert again.status == 1 and "not running, nothing to abort" in again.out

        with db.worker():
            retried = await db.run_cli("turns", "retry", waiting, "--json", app=True)
            assert retried.status == 0, retried.err
            [entry] = retried.json()["retried"]
            [echo] = await db.settled(1, statuses=("completed",))
            assert echo.id == entry["retry_id"] and echo.parent_id == waiting

            paused = await db.send("transfer $40 to carol")
            await db.settled(1, statuses=("paused",))
            approved = await db.run_cli(
                "approvals", "approve", f"{paused}:approval-1", "--by", "alice", "--json",
                app=True,
            )  # fmt: skip
            resume = approved.json()["resume_turn_id"]
            await db.settled(3, statuses=("completed",))  # echo, paused, resume
            assert len(read_ledger(db.ledger)) == 1

            # Round 1 of the resume ran the transfer: a fork after it asks only for the answer.
            forked = await db.run_cli("turns", "fork", resume, "--round", "1", "--json", app=True)
            assert forked.status == 0, forked.err
            fork = forked.json()
            assert fork["source_turn_id"] == resume and fork["round"] == 1
            assert fork["status"] == "pending"

            async def fork_done() -> bool:
                turn = await db.store.get_turn(fork["turn_id"])
                return turn is not None and turn.status.value == "completed"

            await db.wait_for("the fork to complete", fork_done)
            replay = await db.run_cli("turns", "fork", resume, "--round", "0", app=True)
            assert replay.status == 0 and "after round 0" in replay.out
            await db.settled(5, statuses=("completed",))
        shown = (await db.run_cli("turns", "show", fork["turn_id"], "--json")).json()
        source = await db.store.get_turn(resume)
        assert source is not None
        assert shown["turn"]["session_id"] == fork["session_id"] != source.session_id
        assert shown["turn"]["parent_id"] is None
        assert shown["turn"]["input"] == {"kind": "fork", "forked_from": resume, "fork_round": 1}
        assert shown["conversation"][-1]["content"][0]["text"] == "Done. Transaction txn-40-carol."
        # The fork after round 1 ran no tool; the one after round 0 ran the transfer again,
        # under its own idempotency key: a replay is a new turn, as DBOS's fork is.
        keys = [entry["key"] for entry in read_ledger(db.ledger)]
        assert len(keys) == 2 and not any(key.startswith(fork["turn_id"]) for key in keys)

        final = await db.run_cli("turns", "fork", resume, "--round", "2", app=True)
        assert final.status == 1 and "ends with the model's answer" in final.err
        beyond = await db.run_cli("turns", "fork", resume, "--round", "9", app=True)
        assert beyond.status == 2 and "no completed round 9" in beyond.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["turns", "ls", "--status", "lost"], "'lost' is not one of"),
        (["turns", "ls", "--since", "yesterday"], "expected a duration such as"),
        (["turns", "ls", "--limit", "0"], "--limit"),
        (["turns", "retry"], "give the turn ids to retry, or --status"),
        (["turns", "retry", "some-id", "--status", "failed"], "not both"),
        (["turns", "retry", "some-id", "--since", "1h"], "--agent and --since select"),
        (["turns", "abort", "some-id"], "give --app module:attr"),
        (["turns", "fork", "some-id", "--round", "-1"], "--round"),
        (["approvals", "approve", "t:r", "--app", "m:a"], "Missing option '--by'"),
        (["approvals", "approve", "t:r", "--by", "x", "--app", "m:a", "--answer", "{"], "JSON"),
        (["approvals", "ls", "--older-than", "soon"], "expected an age such as"),
        (["migrate", "--from", "0001"], "--from goes with --sql"),
        (["stats", "--bogus"], "No such option"),
    ],
)
def test_usage_errors_exit_2_with_what_to_do(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args, "--db", "sqlite:///unused.db"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_shell_completion_comes_from_click() -> None:
    """``_TURNSTILE_COMPLETE=bash_source turnstile`` prints the completion script; completing
    ``turnstile tu`` offers ``turns`` (what docs/cli.md tells operators to enable)."""
    script = subprocess.run(
        [sys.executable, "-c", "from workers.cli import cli; cli(prog_name='turnstile')"],
        cwd=ROOT,
        env={"_TURNSTILE_COMPLETE": "bash_source", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "_turnstile_completion" in script.stdout
    completed = subprocess.run(
        [sys.executable, "-c", "from workers.cli import cli; cli(prog_name='turnstile')"],
        cwd=ROOT,
        env={
            "_TURNSTILE_COMPLETE": "bash_complete",
            "COMP_WORDS": "turnstile turns re",
            "COMP_CWORD": "2",
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "plain,retry" in completed.stdout.splitlines()
