"""Keyset cursors of the inbox's lists (``GET /inbox`` and the ``/ui`` pages).

A cursor holds the key of the last entry a page examined (a moment and two ids). That entry
may be one the reader was not shown (an inbox policy hid it), so a cursor is sealed, not just
encoded: encrypted and authenticated with a key derived from the UI secret, so a reader learns
nothing from it and cannot make one up. The server opens only cursors it sealed, and a forged
or altered one is a precise 400, never a failed query.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from datetime import datetime

from cryptography.fernet import Fernet, InvalidToken

from engine.errors import InvalidArgumentError
from engine.remote.wire import id_problem

__all__ = ["MAX_CURSOR_LENGTH", "CursorKey", "CursorSeal"]

#: The key a cursor holds: a moment, then two ids (a turn's, and a call's ref).
CursorKey = tuple[datetime, str, str]

#: A cursor seals a timestamp and two ids (a character escapes to <= 12 bytes of JSON).
MAX_CURSOR_LENGTH = 16384


class CursorSeal:
    """Seals keys into cursors and opens them again.

    ``secret`` is the UI secret (``TURNSTILE_UI_SECRET``); without one the key is made by this
    process, and its cursors are refused by other processes and after a restart (the reader
    starts again from the first page).
    """

    def __init__(self, secret: str | bytes | None = None) -> None:
        raw = secret.encode() if isinstance(secret, str) else secret
        #: Whether the key was made here (cursors end with this process).
        self.ephemeral = not raw
        # A key of its own, so the same secret signing sessions never seals a cursor.
        derived = hmac.new(raw or secrets.token_bytes(32), b"turnstile-cursor", hashlib.sha256)
        self._fernet = Fernet(base64.urlsafe_b64encode(derived.digest()))

    def seal(self, key: CursorKey) -> str:
        """The opaque cursor of ``key``."""
        raw = json.dumps([key[0].isoformat(), key[1], key[2]]).encode()
        return self._fernet.encrypt(raw).decode().rstrip("=")

    def open(self, cursor: str) -> CursorKey:
        """The key of a cursor this server sealed; :class:`InvalidArgumentError` otherwise."""
        refused = InvalidArgumentError("The page cursor is not one this server handed out.")
        if len(cursor) > MAX_CURSOR_LENGTH or not cursor.isascii():
            raise refused
        try:
            raw = self._fernet.decrypt(cursor + "=" * (-len(cursor) % 4))
            moment, turn_id, ref = json.loads(raw)
            at = datetime.fromisoformat(moment)
        except (InvalidToken, ValueError, TypeError) as exc:
            raise refused from exc
        # Only a cursor sealed by an older version could fail these; they keep the store safe.
        if at.tzinfo is None or not isinstance(turn_id, str) or not isinstance(ref, str):
            raise refused
        if id_problem(turn_id) is not None or id_problem(ref) is not None:
            raise refused
        return at, turn_id, ref
