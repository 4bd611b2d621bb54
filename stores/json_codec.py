"""JSON text for the database: orjson where it gives the same value, the standard library
where it would not.

Every JSON payload the SQL store writes to its tables (parameters, the one-statement forms'
JSON documents) or reads from them (``jsonb`` columns on PostgreSQL, JSON text on SQLite,
views included) passes through :func:`dumps` and :func:`loads`; notification payloads, which
are never stored, keep the standard library. Why not the standard library alone: payloads
are written and read several times per turn, and orjson does the same work in a fraction of
the CPU (``docs/performance.md``).

orjson is used only where its answer is the standard library's:

- writing, anything orjson refuses falls back to :func:`json.dumps` (which writes it, or
  raises its own ``TypeError``): integers beyond 64 bits, nesting deeper than 254 levels,
  and — refused on purpose, by the passthrough options — ``str``/``int``/``dict``/``list``
  subclasses (enums), dataclasses and datetimes, which the standard library writes
  differently or not at all;
- reading, orjson would turn an integer beyond 64 bits into a float, so text holding a run of
  19 or more digits is read by :func:`json.loads`; so is anything orjson refuses (numbers
  beyond the double range, lone surrogates).

Two differences remain, in values JSON has no form for: NaN and ±Infinity are written as
``null``, as JavaScript's ``JSON.stringify`` writes them (the standard library writes
``NaN``, which is not JSON and which PostgreSQL refuses, failing the write; it still does in
a value that also holds something only the standard library writes); and a ``uuid.UUID`` is
written as its string, where the standard library raises.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps", "loads"]

# Anything orjson would write differently from json.dumps goes to json.dumps (see above).
_WRITE_OPTIONS = (
    orjson.OPT_NON_STR_KEYS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)

# A number orjson might read as a float instead of an integer: 2**63 has 19 digits. Digits
# in strings count too; those documents are merely read the slower way. Found by mapping
# every digit to "0" and everything else to " ", then a substring search: a regular
# expression's scan cost more than orjson's whole parse.
_DIGITS_AS_ZEROS = bytes(ord("0") if byte in b"0123456789" else ord(" ") for byte in range(256))
_LONG_DIGITS = b"0" * 19


def dumps(value: Any) -> str:
    """``value`` as JSON text (compact), as :func:`json.dumps` would write it."""
    try:
        return orjson.dumps(value, option=_WRITE_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError included
        return json.dumps(value, separators=(",", ":"))


def loads(text: str | bytes) -> Any:
    """The value of JSON ``text``, as :func:`json.loads` would read it."""
    if isinstance(text, bytes):
        raw = text
    elif isinstance(text, str):
        raw = text.encode(errors="surrogatepass")
    else:  # json.loads's TypeError (SQLAlchemy's SQLite JSON type relies on it for numbers)
        return json.loads(text)
    if _LONG_DIGITS not in raw.translate(_DIGITS_AS_ZEROS):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)
