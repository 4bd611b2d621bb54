"""The ids Turnstile makes for turns and sessions (``engine.ids``): version 8 UUIDs that start
with the minute, modulo a cycle, and are random after it."""

from __future__ import annotations

import uuid

from engine.ids import MINUTES_PER_CYCLE, new_id

#: 2026-12-07 06:30:00 UTC, seconds since the epoch.
NOW = 1_796_625_000.0


def test_an_id_is_a_version_8_uuid_in_canonical_form() -> None:
    """An id parses as an RFC 9562 UUID of version 8 and is written as UUIDs are written."""
    made = new_id(NOW)
    parsed = uuid.UUID(made)
    assert parsed.version == 8 and parsed.variant == uuid.RFC_4122
    assert str(parsed) == made and len(made) == 36


def test_an_id_starts_with_the_minute_modulo_the_cycle() -> None:
    """The first three hex digits count minutes since the epoch modulo 4,096: ids of one minute
    share them, the next minute's differ, and the count wraps after the cycle."""
    minute = int(NOW // 60)
    assert int(new_id(NOW)[:3], 16) == minute % MINUTES_PER_CYCLE
    assert new_id(NOW)[:3] == new_id(NOW + 59 - NOW % 60)[:3]
    assert new_id(NOW + 60)[:3] != new_id(NOW)[:3]
    assert new_id(NOW + 60 * MINUTES_PER_CYCLE)[:3] == new_id(NOW)[:3]


def test_ids_of_one_minute_differ_in_their_first_characters() -> None:
    """Past the minute the id is random: among many ids made in the same minute, eight
    characters already tell nearly all of them apart, as they do for random UUIDs."""
    made = {new_id(NOW) for _ in range(2000)}
    assert len(made) == 2000
    assert len({found[:8] for found in made}) >= 1990


def test_ids_made_now_carry_the_current_minute() -> None:
    """Without a time, an id carries the clock's minute (or the next one, at the boundary)."""
    import time

    before = int(time.time() // 60) % MINUTES_PER_CYCLE
    made = int(new_id()[:3], 16)
    assert made in {before, (before + 1) % MINUTES_PER_CYCLE}
