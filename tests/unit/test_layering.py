"""Dependencies point one way: engine never imports stores, workers or SQL drivers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"stores", "workers", "sqlalchemy", "psycopg", "alembic", "apscheduler"}


def imported_roots(path: Path) -> set[str]:
    """Top-level package names a module imports (absolute imports only)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_engine_sources_import_no_store_worker_or_sql_module() -> None:
    """No module under engine/ names stores, workers or a SQL library in an import."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & FORBIDDEN)
        for path in (ROOT / "engine").rglob("*.py")
        if imported_roots(path) & FORBIDDEN
    }
    assert offenders == {}


def test_importing_engine_loads_no_store_worker_or_sql_module() -> None:
    """A fresh interpreter that imports engine has loaded none of the forbidden packages."""
    probe = (
        "import sys, engine; "
        f"bad = sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(FORBIDDEN)!r})); "
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""
