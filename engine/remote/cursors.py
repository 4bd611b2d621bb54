"""Keyset cursors of the inbox's lists (``GET /inbox`` and the ``/ui`` pages).

A cursor is opaque to clients: base64 of JSON holding the key of the last entry a page showed
(a moment and two ids). The server decodes only cursors of its own shape, so a forged one is
a precise 400, never a failed query.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime

from engine.errors import InvalidArgumentError
from engine.remote.wire import id_problem

__all__ = ["MAX_CURSOR_LENGTH", "CursorKey", "decode_cursor", "encode_cursor"]

#: The key a cursor holds: a moment, then two ids (a turn's, and a call's ref).
CursorKey = tuple[datetime, str, str]

#: A cursor is base64 of JSON holding a timestamp and two ids (a character escapes to <= 12).
MAX_CURSOR_LENGTH = 8192


def encode_cursor(key: CursorKey) -> str:
    """The opaque cursor of ``key``."""
    raw = json.dumps([key[0].isoformat(), key[1], key[2]]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> CursorKey:
    """The key of a cursor this server handed out; :class:`InvalidArgumentError` otherwise."""
    refused = InvalidArgumentError("The page cursor is not one this server handed out.")
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise refused
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        moment, turn_id, ref = json.loads(base64.urlsafe_b64decode(padded.encode()))
        at = datetime.fromisoformat(moment)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        raise refused from exc
    # A forged cursor can be well-formed and still unusable: a moment without an offset cannot
    # be compared with the stored (aware) ones, and an id no client may send (a NUL, a lone
    # surrogate PostgreSQL cannot encode, 3,000 characters) is no key the server handed out.
    if at.tzinfo is None or not isinstance(turn_id, str) or not isinstance(ref, str):
        raise refused
    if id_problem(turn_id) is not None or id_problem(ref) is not None:
        raise refused
    return at, turn_id, ref
