"""docs/schema.md documents every column of every table (new migrations must document theirs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stores.schema import metadata

DOC = Path(__file__).resolve().parents[2] / "docs" / "schema.md"


def section(table: str) -> str:
    """The text of the ``### `table` …`` section of docs/schema.md ('' when absent)."""
    for chunk in re.split(r"^### ", DOC.read_text(), flags=re.MULTILINE):
        if chunk.startswith(f"`{table}`"):
            return chunk
    return ""


@pytest.mark.parametrize("table", [t.name for t in metadata.sorted_tables])
def test_every_column_is_documented(table: str) -> None:
    """Each column of the table appears, in backticks, in the table's section."""
    text = section(table)
    assert text, f"docs/schema.md has no section for {table}"
    missing = [c.name for c in metadata.tables[table].columns if f"`{c.name}`" not in text]
    assert missing == []
