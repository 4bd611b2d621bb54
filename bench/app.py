"""The app the benchmark's worker processes serve: the banking example on the bench database.

``python -m workers.cli worker --app bench.app:ai --observer bench.app:claims --db URL``
exports ``URL`` as ``TURNSTILE_DATABASE_URL`` before importing this module. Nothing of the
product is changed; the one addition is measurement: ``claims`` is a pool observer that, when
``TURNSTILE_BENCH_CLAIM_LOG`` names a file, writes each claimed turn there as ``<unix time>
<turn id> <attempt>``, with microseconds, at the moment the pool learns of the claim. That is
what "pickup" means in the benchmark.
"""

from __future__ import annotations

import atexit
import os
import time

from bench.common import STATE_KEYS
from engine.store import TurnRecord
from examples.banking import build
from stores import SqlSessionStore

__all__ = ["ClaimClock", "ai", "app", "claims"]


class ClaimClock:
    """A :class:`~workers.observers.PoolObserver` that timestamps every claim, in memory,
    and writes them to ``path`` when the process exits (no file write on the hot path)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.lines: list[str] = []
        if path is not None:
            atexit.register(self.write)

    def turn_claimed(self, turn: TurnRecord) -> None:
        if self.path is not None:
            self.lines.append(f"{time.time():.6f} {turn.id} {turn.attempts}\n")

    def turn_finished(self, turn: TurnRecord, settled: TurnRecord | None, seconds: float) -> None:
        """Nothing to record: the benchmark times the settle from its own side."""

    def write(self) -> None:
        if self.path is not None and self.lines:
            with open(self.path, "a", encoding="utf-8") as log:
                log.writelines(self.lines)
            self.lines.clear()


app = build(store=SqlSessionStore(os.environ["TURNSTILE_DATABASE_URL"]), state_keys=STATE_KEYS)
ai = app.ai
claims = ClaimClock(os.environ.get("TURNSTILE_BENCH_CLAIM_LOG"))
