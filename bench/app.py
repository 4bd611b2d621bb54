"""The app the benchmark's worker processes serve: the banking example on the bench database.

``python -m workers.cli worker --app bench.app:ai --observer bench.app:claims --db URL``
exports ``URL`` as ``TURNSTILE_DATABASE_URL`` before importing this module. Nothing of the
product is changed; the one addition is measurement: ``claims`` is a pool observer
(:class:`bench.common.ClaimClock`) that, when ``TURNSTILE_BENCH_CLAIM_LOG`` names a file, writes
each claimed turn there as ``<unix time> <turn id> <attempt>``, with microseconds, stamped at the
moment the pool learns of the claim (the file is written when the process exits). That is what
"pickup" means in the benchmark. ``--impl turnstile-embedded`` gives its in-process pool a
``ClaimClock`` of its own that writes to the same run's folder.
"""

from __future__ import annotations

import os

from bench.common import STATE_KEYS, ClaimClock
from examples.banking import build
from stores import SqlSessionStore

__all__ = ["ClaimClock", "ai", "app", "claims"]


app = build(store=SqlSessionStore(os.environ["TURNSTILE_DATABASE_URL"]), state_keys=STATE_KEYS)
ai = app.ai
claims = ClaimClock(os.environ.get("TURNSTILE_BENCH_CLAIM_LOG"))
