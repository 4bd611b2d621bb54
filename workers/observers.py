"""The interface through which a worker pool reports each turn it runs, for metrics.

Its own module so that the pool can import it without importing the metrics (which import
the pool).
"""

from __future__ import annotations

from typing import Protocol

from engine.store import TurnRecord

__all__ = ["PoolObserver"]


class PoolObserver(Protocol):
    """What a worker pool tells an observer about each turn it runs.

    The pool calls :meth:`turn_claimed` when it leases a turn (from a claim or a follow-on
    claim) and :meth:`turn_finished` when its run of that turn ends, with the record the
    executor returned (``None`` when the run failed before settling) and the seconds since
    the run started. Both run in the pool's event loop and must not block or raise.
    """

    def turn_claimed(self, turn: TurnRecord) -> None: ...

    def turn_finished(
        self, turn: TurnRecord, settled: TurnRecord | None, seconds: float
    ) -> None: ...
