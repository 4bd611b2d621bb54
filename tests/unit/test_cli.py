"""The ``turnstile`` command line: database URL resolution, app loading and start-up checks."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stores
from workers.cli import DATABASE_URL_ENV, main, redact_url, resolve_db_url

ROOT = Path(__file__).resolve().parents[2]
APP_MODULES = {"probe_app", "engine_app"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No database URL in the environment, and none left behind by `turnstile worker`."""
    monkeypatch.setenv(DATABASE_URL_ENV, "unset")  # records the original value for undo
    monkeypatch.delenv(DATABASE_URL_ENV)


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch current directory that is importable, without leaking modules or paths."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name in APP_MODULES:
            del sys.modules[name]


def test_db_url_prefers_the_flag_then_the_environment_then_sqlite(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--db wins over TURNSTILE_DATABASE_URL, which wins over the SQLite file in .turnstile/."""
    assert resolve_db_url(None) == "sqlite:///.turnstile/turnstile.db"
    assert (app_dir / ".turnstile").is_dir()
    monkeypatch.setenv(DATABASE_URL_ENV, "postgresql://from-env/db")
    assert resolve_db_url(None) == "postgresql://from-env/db"
    assert resolve_db_url("postgresql://from-flag/db") == "postgresql://from-flag/db"


def test_redact_url_hides_only_the_password() -> None:
    """A URL's password is masked and everything else is kept."""
    assert redact_url("postgresql+psycopg://u:s3cr%40t@h:5432/db") == (
        "postgresql+psycopg://u:***@h:5432/db"
    )
    assert redact_url("sqlite:///.turnstile/turnstile.db") == "sqlite:///.turnstile/turnstile.db"


def test_worker_with_an_unknown_app_module_exits_with_a_clear_message() -> None:
    """`turnstile worker --app nonexistent.module:ai` exits 2 naming the module it could not
    import."""
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", "--app", "nonexistent.module:ai"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 2
    assert "cannot import app module 'nonexistent.module'" in out.stderr
    assert "Traceback" not in out.stderr


def test_worker_rejects_an_app_spec_without_attribute(capsys: pytest.CaptureFixture[str]) -> None:
    """--app without ':attribute' is refused before anything is imported."""
    assert main(["worker", "--app", "examples.banking", "--db", "sqlite:///x.db"]) == 2
    assert "module:attribute" in capsys.readouterr().err


def test_worker_exports_the_db_url_before_importing_the_app(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The app module sees --db in TURNSTILE_DATABASE_URL at import time; a non-Engine
    attribute is refused."""
    (app_dir / "probe_app.py").write_text(
        "import os\nSEEN = os.environ.get('TURNSTILE_DATABASE_URL')\nai = 'not an engine'\n"
    )
    assert main(["worker", "--app", "probe_app:ai", "--db", "sqlite:///probe.db"]) == 2
    assert sys.modules["probe_app"].SEEN == "sqlite:///probe.db"
    assert "not an engine.Engine" in capsys.readouterr().err


def test_worker_refuses_a_database_not_at_head(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """When stores.ensure_at_head raises, the worker exits 2 with its message on stderr."""
    (app_dir / "engine_app.py").write_text(
        textwrap.dedent(
            """
            from engine import Engine, ScriptedModel
            ai = Engine(model=ScriptedModel())
            """
        )
    )
    checked: list[str] = []

    def ensure_at_head(url: str) -> None:
        checked.append(url)
        raise RuntimeError("database is at revision 0001, head is 0002: run turnstile migrate")

    monkeypatch.setattr(stores, "ensure_at_head", ensure_at_head, raising=False)
    assert main(["worker", "--app", "engine_app:ai", "--db", "sqlite:///old.db"]) == 2
    assert checked == ["sqlite:///old.db"]
    err = capsys.readouterr().err
    assert "refusing to start" in err and "run turnstile migrate" in err


def test_migrate_runs_the_store_migration_and_hides_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`turnstile migrate` calls stores.migrate with the full URL and prints it redacted."""
    migrated: list[Any] = []
    monkeypatch.setattr(stores, "migrate", migrated.append, raising=False)
    url = "postgresql://turnstile:hunter2@db.example/turnstile"
    assert main(["migrate", "--db", url]) == 0
    assert migrated == [url]
    out = capsys.readouterr().out
    assert out.strip() == "database at head: postgresql://turnstile:***@db.example/turnstile"
    assert "hunter2" not in out


def test_version_prints_the_installed_version() -> None:
    """``turnstile --version`` prints the distribution's version and exits 0."""
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"turnstile {importlib.metadata.version('turnstile')}"


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_a_bad_log_level_is_a_usage_error_not_a_traceback(command: str) -> None:
    """An unknown ``--log-level`` exits 2 with a usage message naming the choices, before
    anything is imported or connected; any case of a known level is accepted."""
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", command, "--app", "x:y", "--log-level", "LOUD"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "invalid choice: 'LOUD'" in done.stderr
    assert "Traceback" not in done.stderr
    assert main([command, "--app", "no_such_module_here:ai", "--log-level", "debug"]) == 2
