"""The prose docs agree with the code they describe: the migrations docs/architecture.md lists,
the parameters docs/configuration.md gives ``define_tool`` and ``define_interrupt``, the form
of a database URL, and what docs/inbox.md says about the index of decided approvals. Each
test reads the code (the migration files, the functions' signatures) rather than a copy of
it, so a change to the code without its doc fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MIGRATIONS = ROOT / "migrations" / "versions"
#: A row of docs/architecture.md's table naming a migration file: its name and what it adds.
MIGRATION_ROW = re.compile(r"^\| `migrations/versions/([^`]+)` \| (.*) \|$", flags=re.MULTILINE)


def migration_files() -> list[Path]:
    """Every Alembic migration in migrations/versions/, in revision order."""
    return sorted(path for path in MIGRATIONS.glob("*.py") if path.name != "__init__.py")


def revision_of(migration: Path) -> str:
    """The ``revision`` a migration file assigns, read from its source (not imported)."""
    for statement in ast.parse(migration.read_text()).body:
        if (
            isinstance(statement, ast.AnnAssign | ast.Assign)
            and "revision" in assigned_names(statement)
            and isinstance(statement.value, ast.Constant)
        ):
            return str(statement.value.value)
    raise AssertionError(f"{migration.name} assigns no revision")


def assigned_names(statement: ast.AnnAssign | ast.Assign) -> set[str]:
    """The plain names an assignment (annotated or not) binds."""
    targets = [statement.target] if isinstance(statement, ast.AnnAssign) else statement.targets
    return {target.id for target in targets if isinstance(target, ast.Name)}


def test_every_migration_file_has_a_row_in_the_architecture_doc() -> None:
    """Each migration file (named by its full file name, which starts with its revision) has a
    row in docs/architecture.md saying what it adds, and no row names a file that is gone."""
    rows = dict(MIGRATION_ROW.findall((DOCS / "architecture.md").read_text()))
    files = migration_files()
    misnamed = [path.name for path in files if not path.stem.startswith(revision_of(path) + "_")]
    assert misnamed == [], "a migration's file name must start with its revision"
    assert sorted(rows) == [path.name for path in files]
    assert [name for name, adds in rows.items() if not adds.strip()] == []
