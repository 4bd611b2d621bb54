"""The store's JSON codec gives the standard library's values, faster; where orjson would
give another value, the standard library answers."""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stores.json_codec import dumps, loads

# JSON values with every number Python's json writes as JSON: integers of any size, finite
# floats; text of any code point (surrogates included: the standard library writes them).
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (1 and 1.0 differ, as True and 1 do)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@given(JSON_VALUES)
def test_what_it_writes_the_standard_library_reads_back_unchanged(value: Any) -> None:
    """dumps writes JSON the standard library reads as the same value."""
    assert same(json.loads(dumps(value)), value)


@given(JSON_VALUES)
def test_it_reads_what_the_standard_library_wrote_as_the_standard_library_does(
    value: Any,
) -> None:
    """loads reads text and bytes as json.loads does, big integers included."""
    text = json.dumps(value)
    assert same(loads(text), json.loads(text))
    assert same(loads(text.encode(errors="surrogatepass")), json.loads(text))


def test_integers_beyond_64_bits_stay_integers() -> None:
    """2**100 + 1 has no float form: written and read back exactly, not rounded."""
    for number in (2**63, 2**64, 2**100 + 1, -(2**70) - 1):
        assert dumps([number]) == f"[{number}]"
        assert same(loads(f'{{"n": {number}}}'.encode()), {"n": number})


def test_values_the_standard_library_writes_differently_are_written_by_it() -> None:
    """Enums (str subclasses) are written as their value, dict keys that are not strings as
    the standard library names them; datetimes are refused with its TypeError."""

    class Colour(StrEnum):
        RED = "red"

    assert json.loads(dumps({"c": Colour.RED, 1: True, None: 2})) == {
        "c": "red",
        "1": True,
        "null": 2,
    }
    with pytest.raises(TypeError):
        dumps({"at": datetime.now(UTC)})


def test_the_two_documented_differences() -> None:
    """NaN and infinities become null (PostgreSQL refuses the standard library's NaN); a
    UUID becomes its string (the standard library refuses it)."""
    assert dumps([math.nan, math.inf, -math.inf]) == "[null,null,null]"
    key = uuid.uuid4()
    assert dumps({"id": key}) == f'{{"id":"{key}"}}'


def test_what_is_not_text_is_refused_as_the_standard_library_refuses_it() -> None:
    """A number handed in place of text raises TypeError, which SQLAlchemy's SQLite JSON
    type catches for JSON text SQLite stored as a number."""
    with pytest.raises(TypeError):
        loads(5)  # type: ignore[arg-type]
