"""The app the benchmark's worker processes serve: the banking example on the bench database.

``python -m workers.cli worker --app bench.app:ai --db URL`` exports ``URL`` as
``TURNSTILE_DATABASE_URL`` before importing this module. Nothing of the product is changed;
the one addition is measurement: when ``TURNSTILE_BENCH_CLAIM_LOG`` names a file, the pool's
own INFO record "turn <id> attempt <n> claimed" (logged right after the claim committed) is
also written there as ``<unix time> <turn id> <attempt>``, with microseconds — the worker
log's own timestamps only have milliseconds. That is what "pickup" means in the benchmark.
"""

from __future__ import annotations

import logging
import os
from typing import TextIO

from bench.common import STATE_KEYS
from examples.banking import build
from stores import SqlSessionStore

__all__ = ["ClaimLog", "ai", "app"]


class ClaimLog(logging.Handler):
    """Writes the pool's "claimed" records, buffered (flushed when logging shuts down)."""

    def __init__(self, path: str) -> None:
        super().__init__(logging.INFO)
        self.stream: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close)

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if "claimed" in str(record.msg) and isinstance(args, tuple) and len(args) >= 2:
            self.stream.write(f"{record.created:.6f} {args[0]} {args[1]}\n")

    def flush(self) -> None:
        if not self.stream.closed:
            self.stream.flush()

    def close(self) -> None:
        if not self.stream.closed:
            self.stream.close()
        super().close()


app = build(store=SqlSessionStore(os.environ["TURNSTILE_DATABASE_URL"]), state_keys=STATE_KEYS)
ai = app.ai

if os.environ.get("TURNSTILE_BENCH_CLAIM_LOG"):
    logging.getLogger("turnstile.worker").addHandler(
        ClaimLog(os.environ["TURNSTILE_BENCH_CLAIM_LOG"])
    )
