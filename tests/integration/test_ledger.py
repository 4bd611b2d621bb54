"""The example's idempotent ledger (examples.banking.book) under workers in several processes.

The durable tests' worker processes all book into one ledger file: a booking reads the
ledger to check its key, while other processes append. Unlocked, a reader sometimes saw a
line half written and the transfer failed with a JSON error (the claim-race test, about
one run in ten), and two bookings of one key at once could both append.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from examples.banking import TransferRequest, book, read_ledger

PROCESSES, BOOKINGS = 4, 150


def _book_many(ledger: str, worker: int, start: Any) -> None:
    start.wait()  # all at once: spawned processes take a while to import
    # Every process books the same keys, as workers re-running one call under its
    # idempotency key after a crash would.
    for n in range(BOOKINGS):
        book(Path(ledger), f"call-{n}", TransferRequest(amount=n, toAccount=f"acct {worker}"))


def test_processes_booking_at_once_book_each_key_once_and_every_line_parses(
    tmp_path: Path,
) -> None:
    """Four processes booking the same keys into one ledger at once never fail to read it,
    and book each key exactly once."""
    ledger = tmp_path / "ledger.jsonl"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PROCESSES)
    workers = [
        context.Process(target=_book_many, args=(str(ledger), w, start)) for w in range(PROCESSES)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=60)

    assert [process.exitcode for process in workers] == [0] * PROCESSES
    keys = [entry["key"] for entry in read_ledger(ledger)]
    assert sorted(keys) == sorted(f"call-{n}" for n in range(BOOKINGS))
