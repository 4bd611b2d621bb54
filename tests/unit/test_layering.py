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


#: The floors of ``engine``, top to bottom (docs/architecture.md, "The wings"): a module may
#: import modules of its own floor and of the floors below it, never of one above. The
#: package root (the face) sits above them all.
FLOORS: list[tuple[str, ...]] = [
    ("engine.remote",),
    ("engine.approvals",),
    ("engine.engine", "engine.fork"),
    ("engine.agent",),
    ("engine.chat",),
    ("engine.turns",),
    ("engine.state",),
    ("engine.tools",),
    (
        "engine.response",
        "engine.approval_policy",
        "engine.escalation",
        "engine.rejection",
        "engine.telemetry",
        "engine.webhooks",
    ),
    ("engine.store", "engine.models", "engine.scripted"),
    ("engine.model",),
    ("engine.conversation",),
    ("engine.errors", "engine.status", "engine.ids"),
]


def floor_of(module: str) -> int | None:
    """The index of the floor ``module`` lives on (-1: the face; ``None``: no floor)."""
    if module == "engine":
        return -1
    for index, wings in enumerate(FLOORS):
        if any(module == wing or module.startswith(wing + ".") for wing in wings):
            return index
    return None


def test_every_engine_module_lives_on_a_floor() -> None:
    """A new module joins a wing (or the face) rather than floating between them."""
    assert [m for m in engine_import_graph() if floor_of(m) is None] == []


def test_no_engine_module_imports_a_wing_above_its_own() -> None:
    """Dependencies point down the floors: the store never reaches for a turn's life, a
    turn's life never for the human side or the web surface."""
    graph = engine_import_graph()
    upward = [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if (floor_of(target) or 0) < (floor_of(module) or 0)
    ]
    assert upward == []
