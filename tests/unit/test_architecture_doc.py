"""docs/architecture.md names every module of engine/, stores/ and workers/, and every
migration: a module or migration added without a line there fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def test_every_module_is_named_in_the_module_map() -> None:
    """Each module file appears in docs/architecture.md by its file name."""
    missing = [
        str(path.relative_to(ROOT))
        for package in ("engine", "stores", "workers")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "__init__.py" and f"`{path.name}`" not in DOC and path.name not in DOC
    ]
    assert missing == []


def test_every_migration_is_listed() -> None:
    """Each migration's revision has its row in the migrations table."""
    names = " ".join(path.name for path in (ROOT / "migrations" / "versions").glob("*.py"))
    revisions = sorted(re.findall(r"\b(\d{4})_\w+\.py", names))
    listed = set(re.findall(r"`migrations/versions/(\d{4})_\w+\.py`", DOC))
    assert [r for r in revisions if r not in listed] == []
