"""The prose docs agree with the code they describe: the migrations docs/architecture.md lists,
the parameters docs/configuration.md gives ``define_tool`` and ``define_interrupt``, the form
of a database URL, and what docs/inbox.md says about the index of decided approvals. Each
test reads the code (the migration files, the functions' signatures) rather than a copy of
it, so a change to the code without its doc fails here."""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.engine import Engine

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


def documented_entry(function: Callable[..., object]) -> tuple[list[str], str]:
    """The parameters docs/configuration.md's bold signature of ``Engine.<function>`` lists
    (``name`` or ``name=default``, and ``*``), and the prose of its entry up to the next bold
    signature or heading."""
    heading = f"**`Engine.{function.__name__}("
    text = (DOCS / "configuration.md").read_text()
    assert heading in text, f"docs/configuration.md has no entry for {function.__qualname__}"
    entry = re.split(r"^(?:\*\*`|#)", text.split(heading, 1)[1], maxsplit=1, flags=re.M)[0]
    listed, prose = entry.split(")`**", 1)
    return [part.strip() for part in " ".join(listed.split()).split(",")], prose


def signature_as_written(function: Callable[..., object]) -> list[str]:
    """The parameters of ``function`` as the doc writes a signature: ``*`` before the
    keyword-only ones, ``name=default`` with strings in double quotes."""
    written: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "self":
            continue
        if parameter.kind is parameter.KEYWORD_ONLY and "*" not in written:
            written.append("*")
        default = parameter.default
        if default is parameter.empty:
            written.append(parameter.name)
        else:
            shown = json.dumps(default) if isinstance(default, str) else repr(default)
            written.append(f"{parameter.name}={shown}")
    return written


@pytest.mark.parametrize(
    "function", [Engine.define_agent, Engine.define_tool, Engine.define_interrupt]
)
def test_configuration_doc_gives_every_parameter_of_the_tool_definitions(
    function: Callable[..., object],
) -> None:
    """docs/configuration.md's entry for ``define_agent``, ``define_tool`` and
    ``define_interrupt`` writes the
    function's signature as the code has it (each parameter, in order, with its default) and
    then says what each parameter does, naming it in backticks."""
    listed, prose = documented_entry(function)
    assert listed == signature_as_written(function)
    unexplained = [
        name
        for name in inspect.signature(function).parameters
        if name != "self" and not re.search(rf"`{name}[`=]", prose)
    ]
    assert unexplained == [], "the entry's prose does not say what these parameters do"


def prose_docs() -> list[Path]:
    """The README and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_docs_write_postgresql_urls_without_a_driver() -> None:
    """The docs write a PostgreSQL URL as ``postgresql://`` (the form the settings and the CLI
    document, which Turnstile maps to psycopg 3 itself), never ``postgresql+psycopg://``."""
    driver_urls = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in prose_docs()
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "postgresql+psycopg://" in line
    ]
    assert driver_urls == []


def literal_or_none(node: ast.expr) -> object:
    """The value of a literal argument; ``None`` for anything computed (a name, a call)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def indexes_on_decided_at() -> list[str]:
    """The names of the indexes the migrations create on ``tool_calls.decided_at``."""
    names: list[str] = []
    for migration in migration_files():
        for node in ast.walk(ast.parse(migration.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "create_index"
                and len(node.args) >= 3
            ):
                index, table, columns = (literal_or_none(arg) for arg in node.args[:3])
                if table == "tool_calls" and isinstance(columns, list) and "decided_at" in columns:
                    names.append(str(index))
    return names


def test_inbox_doc_names_the_index_on_decided_at() -> None:
    """docs/inbox.md names each index a migration builds on ``tool_calls.decided_at`` (the
    history of decisions reads it), and says nowhere that there is no such index."""
    indexes = indexes_on_decided_at()
    assert indexes != [], "no migration indexes tool_calls.decided_at: update this test"
    text = (DOCS / "inbox.md").read_text()
    assert [index for index in indexes if f"`{index}`" not in text] == []
    denials = re.findall(r"[^.]*\bno index\b[^.]*`decided_at`[^.]*\.", " ".join(text.split()))
    assert denials == []
