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


def engine_import_graph() -> dict[str, set[str]]:
    """Which engine modules each engine module imports: every import statement, at module
    level, inside functions or under ``TYPE_CHECKING`` alike (a deferred import is still a
    dependency)."""
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (ROOT / "engine").rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from engine.remote import auth`` imports the module engine.remote.auth.
                named = {f"{node.module}.{alias.name}" for alias in node.names}
                targets.update(named & modules.keys() or {node.module})
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def test_engine_modules_import_each_other_without_cycles() -> None:
    """No engine module reaches itself through the modules it imports."""
    graph = engine_import_graph()
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            if target in path:
                cycles.append([*path[path.index(target) :], target])
            elif target not in seen:
                seen.add(target)
                visit(target, [*path, target])

    seen: set[str] = set()
    for module in sorted(graph):
        if module not in seen:
            seen.add(module)
            visit(module, [module])
    assert cycles == []
