"""The ids Turnstile makes for turns and sessions: random, but grouped by the minute.

A turn's id is the key of ``turns`` and the leading column of the keys of every table that
holds a turn's rows (its messages, journal, history, approvals); a session's id leads
``sessions`` and the session's turns. B-tree indexes store their keys in order, so where each new
key falls decides how much of an index a busy database writes: a random key (UUID version 4)
lands on a random leaf, and once an index has more leaves than a checkpoint interval has
inserts, nearly every insert's leaf is written to the WAL whole after each checkpoint
(docs/performance.md: WAL per workflow grows several times from 10,000 to 1,000,000 turns).
Keys that start with the time (UUID version 7) keep new rows on a few leaves, but they also make
every recent id start with the same characters, and an operator names a turn by its first
characters (``turnstile turns show 3f9a1c2e``).

So an id here starts with the minute, counted modulo 4,096 (three hex digits, a cycle of about
68 hours), and the rest is random: the rows created within one minute share a narrow band of
each index, revisited only by the ids of the same minute in earlier cycles, while the ids
of a listing still differ after a few characters. Formatted as a UUID (RFC 9562's version 8,
whose layout is the application's), with 110 random bits.
"""

from __future__ import annotations

import secrets
import time
import uuid

__all__ = ["MINUTES_PER_CYCLE", "new_id"]

#: The minute counter wraps after this many minutes (three hex digits).
MINUTES_PER_CYCLE = 4096

_VERSION = 8
_RANDOM_BITS = 128 - 12 - 4 - 2  # after the minute, the version and the variant


def new_id(now: float | None = None) -> str:
    """A new turn or session id: the minute of ``now`` (seconds since the epoch; the current
    time by default) modulo :data:`MINUTES_PER_CYCLE` in its first three hex digits, then
    random bits, as a UUID of version 8."""
    seconds = time.time() if now is None else now
    minute = int(seconds // 60) % MINUTES_PER_CYCLE
    rest = secrets.randbits(_RANDOM_BITS)
    # Layout (most significant first): minute 12 bits, random 36, version 4, random 12,
    # variant 2 (binary 10), random 62.
    value = minute << 116
    value |= (rest >> 74) << 80
    value |= _VERSION << 76
    value |= ((rest >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rest & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))
