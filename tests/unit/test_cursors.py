"""The inbox's page cursors: sealed, so they hide the key they hold and cannot be forged."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest

from engine.errors import InvalidArgumentError
from engine.remote.cursors import MAX_CURSOR_LENGTH, CursorSeal

SECRET = "cursor-unit-secret-0123456789abcdef0123"
KEY = (datetime(2026, 12, 6, 9, 30, tzinfo=UTC), "turn-3f2a", "approval-1")


def test_a_sealed_cursor_opens_to_its_key_on_any_seal_with_the_same_secret() -> None:
    """Two processes given the same secret read each other's cursors."""
    cursor = CursorSeal(SECRET).seal(KEY)
    assert CursorSeal(SECRET).open(cursor) == KEY
    assert "=" not in cursor and "/" not in cursor and "+" not in cursor


def test_a_cursor_shows_nothing_of_its_key() -> None:
    """Neither the cursor nor its base64 decoding holds the ids or the moment."""
    cursor = CursorSeal(SECRET).seal(KEY)
    decoded = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    for part in (KEY[1], KEY[2], "2026-12-06"):
        assert part not in cursor
        assert part.encode() not in decoded


def test_a_cursor_sealed_twice_differs() -> None:
    """Sealing the same key again gives another text, so equal positions cannot be matched."""
    seal = CursorSeal(SECRET)
    assert seal.seal(KEY) != seal.seal(KEY)


@pytest.mark.parametrize(
    "forged",
    [
        "",
        "not-a-cursor!",
        base64.urlsafe_b64encode(b'["2026-12-06T09:30:00+00:00", "t", "r"]').decode(),
        "é" * 10,
        "A" * (MAX_CURSOR_LENGTH + 1),
    ],
)
def test_a_cursor_this_server_did_not_seal_is_refused(forged: str) -> None:
    with pytest.raises(InvalidArgumentError, match="not one this server handed out"):
        CursorSeal(SECRET).open(forged)


def test_an_altered_cursor_or_another_secret_is_refused() -> None:
    """One character changed, or a seal with another secret, and the cursor opens no more."""
    cursor = CursorSeal(SECRET).seal(KEY)
    middle = len(cursor) // 2
    altered = cursor[:middle] + ("A" if cursor[middle] != "A" else "B") + cursor[middle + 1 :]
    with pytest.raises(InvalidArgumentError):
        CursorSeal(SECRET).open(altered)
    with pytest.raises(InvalidArgumentError):
        CursorSeal("another-unit-secret-0123456789abcdef0").open(cursor)


def test_without_a_secret_each_seal_has_its_own_key() -> None:
    """A process with no UI secret seals with a key of its own; another process refuses."""
    mine, theirs = CursorSeal(), CursorSeal(None)
    assert mine.ephemeral and not CursorSeal(SECRET).ephemeral
    assert mine.open(mine.seal(KEY)) == KEY
    with pytest.raises(InvalidArgumentError):
        theirs.open(mine.seal(KEY))
