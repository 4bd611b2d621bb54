"""The durable demo: an approval that survives a worker killed in the middle of a transfer.

Run it with ``make demo`` (``python -m examples.demo``). Everything is real and local: an
SQLite file under ``.turnstile/demo/``, worker pools in separate processes
(``turnstile worker --app examples.banking:ai``), the offline scripted model. The demo sends a
transfer, shows the pending approval as a row of the ``open_approvals`` view, approves it,
SIGKILLs the worker while the transfer runs, starts a new worker that finishes the turn from
its journal (the transfer re-runs under the same idempotency key, so the ledger books it
once), and prints the finished turn and its timeline from SQL. With a terminal on stdin it
asks you to approve; without one (or with ``--yes``) it answers by itself.

The workers run as a deployment runs them: ``turnstile worker`` refuses an app whose
client-managed agent signs with a published example key, so the demo makes a fresh signing
key for each run (its database is new each run too) rather than running them with ``--dev``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

WORKDIR = Path(".turnstile") / "demo"
TRANSFER_SECONDS = 2.0
LEASE_SECONDS = 2.0
BOLD = "\033[1m" if sys.stdout.isatty() else ""
PLAIN = "\033[0m" if sys.stdout.isatty() else ""


def say(text: str = "") -> None:
    """Print a line at once (the workers print to their own log files)."""
    print(text, flush=True)


def heading(text: str) -> None:
    """A scene heading."""
    say()
    say(f"{BOLD}== {text} =={PLAIN}")


def start_worker(number: int, url: str) -> subprocess.Popen[bytes]:
    """``turnstile worker`` in its own process, logging to ``worker-<n>.log``."""
    log = (WORKDIR / f"worker-{number}.log").open("wb")
    command = [
        sys.executable,
        "-m",
        "workers.cli",
        "worker",
        "--app",
        "examples.banking:ai",
        "--db",
        url,
        "--concurrency",
        "2",
    ]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    say(f"  started worker {number} (pid {process.pid}): {' '.join(command[2:])}")
    return process


def ask(question: str, automatic: bool) -> bool:
    """y/n from the terminal, or yes when answering automatically."""
    if automatic:
        say(f"  {question} [Y/n] y  (automatic)")
        return True
    answer = input(f"  {question} [Y/n] ").strip().lower()
    return answer in ("", "y", "yes")


async def wait_for(condition: Any, what: str, timeout: float = 30.0) -> Any:
    """Poll an async condition until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await condition()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


async def run(automatic: bool) -> int:
    """The demo proper (see the module docstring)."""
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    url = f"sqlite:///{WORKDIR / 'demo.db'}"
    ledger = WORKDIR / "ledger.jsonl"
    key_id = "demo-" + secrets.token_hex(4)
    os.environ.update(
        {
            "TURNSTILE_DATABASE_URL": url,
            # Read by the app here and by every worker: one key, made for this run only.
            "TURNSTILE_STATE_KEYS": f"{key_id}:{secrets.token_urlsafe(32)}",
            "TURNSTILE_LEDGER": str(ledger),
            "TURNSTILE_TRANSFER_SECONDS": str(TRANSFER_SECONDS),
            "TURNSTILE_LEASE_SECONDS": str(LEASE_SECONDS),
        }
    )
    from engine.store import ApprovalQuery
    from stores import SqlSessionStore, migrate

    migrate(url)
    # Imported after the settings above: the module-level app builds its store from them.
    from examples import banking

    agent = banking.banking_agent
    store = agent.store
    assert isinstance(store, SqlSessionStore)
    say(f"{BOLD}Turnstile durable demo{PLAIN}: bankingAgent on {url}")
    if automatic:
        say("  (no TTY: answering automatically)")
    say(f"  client-managed state is signed with {key_id}, a key made for this run")
    workers = [start_worker(1, url)]
    try:
        heading("1. A transfer pauses for approval")
        chat = agent.chat()
        say("  You:   Transfer $500 to my savings account.")
        paused = await chat.send("Transfer $500 to my savings account.")
        approval = paused.interrupts[0]
        say(f"  Agent paused ({paused.finish_reason}); snapshot {paused.snapshot_id}")
        say("  The pending approval, as the inbox lists it (SQL: the open_approvals view):")
        for row in await store.list_approvals(ApprovalQuery()):
            age = (datetime.now(UTC) - row.created_at).total_seconds()
            say(
                f"    agent={row.agent} interrupt={row.interrupt} ref={row.ref} "
                f"details={row.input['details']!r} age={age:.2f}s"
            )

        heading("2. Approve; the worker dies in the middle of the transfer")
        if not ask(f"Approve '{approval.input.details}'?", automatic):
            done = await chat.resume(respond=[approval.respond({"approved": False})])
            say(f"  Agent: {done.text}  (nothing to recover: the transfer never ran)")
            return 0
        pending = await chat.resume(
            respond=[approval.respond({"approved": True, "feedback": "ok"})], wait=False
        )
        turn_id = str(pending.snapshot_id)
        say(f"  resume queued as turn {turn_id} (status {pending.status.value})")

        async def transfer_running() -> bool:
            calls = await store.list_calls(turn_id)
            running = any(c.name == "transferMoney" and c.status.value == "running" for c in calls)
            return running and bool(banking.read_ledger(ledger))

        await wait_for(transfer_running, "the transfer to book the money")
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        say("  SIGKILL worker 1 while transferMoney runs (its journal row says: running)")
        booked = banking.read_ledger(ledger)
        say(
            f"  ledger after the kill: {len(booked)} booking(s) — the money moved, but the "
            "journal never heard back"
        )

        async def stuck() -> list[Any]:
            return [s for s in await store.stuck_turns() if s.turn_id == turn_id]

        [row] = await wait_for(stuck, "the lease to expire")
        say(
            f"  stuck_turns: turn {row.turn_id[:8]}… reason={row.reason!r} "
            f"(owner {row.lease_owner})"
        )
        workers.append(start_worker(2, url))

        heading("3. A new worker finishes the turn from its journal")
        done = await agent.wait(turn_id, timeout=60)
        say(f"  Agent: {done.text}")
        record = await store.get_turn(turn_id)
        assert record is not None
        booked = banking.read_ledger(ledger)
        say(
            f"  turn {turn_id[:8]}…: {record.status.value}, {record.attempts} attempts; "
            "transferMoney ran again under the same idempotency key"
        )
        say(
            f"  ledger: {len(booked)} booking(s): "
            + ", ".join(f"${e['amount']:g} to {e['toAccount']} (key {e['key']})" for e in booked)
        )
        say("  timeline (from the turn_timeline view):")
        for entry in await store.timeline(turn_id):
            say(f"    {entry.at:%H:%M:%S.%f}  {entry.kind:<16} {entry.detail}")

        heading("4. A denial, then two approvals in one resume")
        denied_chat = agent.chat()
        denied = await denied_chat.send("Transfer $1200 to my vacation fund.")
        denied = await denied_chat.resume(
            respond=[denied.interrupts[0].respond({"approved": False, "feedback": "Not now"})]
        )
        say(f"  Agent: {denied.text}")
        pair_chat = agent.chat()
        pair = await pair_chat.send("Transfer $50 to Alice and $75 to Bob")
        say(
            f"  {len(pair.interrupts)} approvals pending: "
            + "; ".join(i.input.details for i in pair.interrupts)
        )
        pair = await pair_chat.resume(
            respond=[i.respond({"approved": True}) for i in pair.interrupts]
        )
        say(f"  Agent: {pair.text}")
        say(f"  ledger now holds {len(banking.read_ledger(ledger))} bookings")
        say()
        say(f"Database, ledger and worker logs are in {WORKDIR}/")
        return 0
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
        await store.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m examples.demo``."""
    parser = argparse.ArgumentParser(prog="python -m examples.demo", description=__doc__)
    parser.add_argument("--yes", action="store_true", help="approve without asking")
    args = parser.parse_args(argv)
    automatic = args.yes or not sys.stdin.isatty()
    return asyncio.run(run(automatic))


if __name__ == "__main__":
    raise SystemExit(main())
