"""The ``turnstile`` command line: database URL resolution, app loading and start-up checks."""

from __future__ import annotations

import importlib.metadata
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

import stores
from engine import Engine, RetryPolicy, ScriptedModel
from engine.models.anthropic import AnthropicModel
from engine.models.openai import OpenAIChatModel
from stores import InMemorySessionStore, SqlSessionStore
from stores.database import normalise_url
from stores.sql import POOL_SIZE_ENV, default_pool_size
from workers.cli import DATABASE_URL_ENV, cli, main, resolve_db_url
from workers.cli.params import env_name
from workers.cli.startup import (
    Refused,
    apply_retry_defaults,
    check_same_database,
    describe_model,
    worker_pool_size,
)

ROOT = Path(__file__).resolve().parents[2]
APP_MODULES = {"probe_app", "engine_app"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No database URL in the environment, and none left behind by `turnstile worker`."""
    monkeypatch.setenv(DATABASE_URL_ENV, "unset")  # records the original value for undo
    monkeypatch.delenv(DATABASE_URL_ENV)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Commands run in this process configure the root logger: undo it after each test."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)


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
    assert "Invalid value for '--log-level'" in done.stderr
    assert "'LOUD' is not one of 'debug', 'info', 'warning', 'error', 'critical'" in done.stderr
    assert "Traceback" not in done.stderr
    assert main([command, "--app", "no_such_module_here:ai", "--log-level", "debug"]) == 2


# -- options and their environment variables ------------------------------------------------


def _options() -> list[tuple[str, click.Option]]:
    """Every option of every command, as ``(command, option)``."""
    return [
        (name, param)
        for name, command in cli.commands.items()
        for param in command.params
        if isinstance(param, click.Option) and param.name != "help"
    ]


def test_every_option_reads_its_turnstile_variable() -> None:
    """``--some-flag`` reads ``TURNSTILE_SOME_FLAG``; ``--db`` reads TURNSTILE_DATABASE_URL."""
    for command, param in _options():
        flag = param.opts[0]
        expected = DATABASE_URL_ENV if flag == "--db" else env_name(flag)
        assert param.envvar == expected, (command, flag)
        assert expected.startswith("TURNSTILE_")
    assert env_name("--max-turns-per-principal") == "TURNSTILE_MAX_TURNS_PER_PRINCIPAL"


def test_docs_list_every_option_with_its_variable_and_default() -> None:
    """docs/configuration.md's flag table has a row per option naming its variable, the
    commands that take it and its default as the code has it."""
    docs = (ROOT / "docs" / "configuration.md").read_text()
    table = docs.split("| flag | variable | default | commands | meaning |\n", 1)[1]
    rows: dict[str, list[str]] = {}
    for line in table.split("\n\n", 1)[0].splitlines()[1:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`").split()[0]] = cells
    for command, param in _options():
        flag = param.opts[0]
        assert flag in rows, f"docs/configuration.md has no row for {flag}"
        _, variable, default, commands, _meaning = rows[flag]
        assert variable == f"`{param.envvar}`", flag
        assert command in commands, (flag, command)
        value = param.default  # Click's sentinel when an option has none
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            assert default.startswith(f"`{shown}`"), (flag, default, shown)
    flags = {param.opts[0] for _, param in _options()}
    assert set(rows) == flags, "rows for options that do not exist"


def test_a_flag_wins_over_its_variable_which_wins_over_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Click's own resolution, through the commands as defined."""
    command = cli.commands["worker"]

    def concurrency(*argv: str) -> int:
        with command.make_context("worker", ["--app", "m:a", *argv]) as ctx:
            return int(ctx.params["concurrency"])

    assert concurrency() == 4
    monkeypatch.setenv("TURNSTILE_CONCURRENCY", "7")
    assert concurrency() == 7
    assert concurrency("--concurrency", "2") == 2


def test_worker_pool_size_grows_with_concurrency() -> None:
    """A connection of the hot path per slot, and three or four more (its pool holds twice
    pool_size)."""
    assert [worker_pool_size(n) for n in (1, 2, 4, 8, 33)] == [2, 3, 4, 6, 18]
    for slots in range(1, 100):
        assert 2 * worker_pool_size(slots) >= slots + 3


def test_a_postgres_scheme_url_is_accepted_and_an_unknown_one_refused() -> None:
    assert resolve_db_url("postgres://u:pw@db.example/app") == "postgres://u:pw@db.example/app"
    assert normalise_url("postgres://u:pw@db.example/app").drivername == "postgresql+psycopg"
    with pytest.raises(Refused, match="Unsupported database 'mysql'"):
        resolve_db_url("mysql://u:pw@db.example/app")


# -- the app's store, retries, models ----------------------------------------------------------


def _sqlite_app(tmp_path: Path, file: str) -> Engine:
    ai = Engine(model=ScriptedModel(), state_keys={"k": "unit-test-secret"})
    ai.define_agent(name="queued", store=SqlSessionStore(f"sqlite:///{tmp_path / file}"))
    ai.define_agent(name="memory", store=InMemorySessionStore())
    return ai


def test_an_app_on_the_same_database_passes_however_the_url_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same SQLite file by a relative or an absolute path is the same database."""
    monkeypatch.chdir(tmp_path)
    app = _sqlite_app(tmp_path, "app.db")
    check_same_database(app, f"sqlite:///{tmp_path / 'app.db'}")
    check_same_database(app, "sqlite:///app.db")
    with pytest.raises(Refused, match=r"agent 'queued' keeps its turns in sqlite:///.*/app\.db"):
        check_same_database(app, "sqlite:///other.db")


def test_postgres_databases_differ_by_server_and_name_not_by_credentials() -> None:
    same = _identity("postgresql://alice:pw@db.example:5432/app")
    assert _identity("postgres://bob@db.example/app") == same
    assert _identity("postgresql://alice@db.example/other") != same
    assert _identity("postgresql://alice@db.example:6543/app") != same


def _identity(url: str) -> tuple[str, ...]:
    from workers.cli.startup import _database_identity

    return _database_identity(normalise_url(url))


def test_retry_flags_replace_only_the_default_policy() -> None:
    """Agents given max_attempts= or retry= keep theirs; the rest get the command line's."""
    ai = Engine(model=ScriptedModel(), state_keys={"k": "unit-test-secret"})
    plain = ai.define_agent(name="plain", store=InMemorySessionStore())
    counted = ai.define_agent(name="counted", store=InMemorySessionStore(), max_attempts=2)
    own = RetryPolicy(max_attempts=9, initial_delay=4.0)
    tuned = ai.define_agent(name="tuned", store=InMemorySessionStore(), retry=own)
    assert plain.retry == RetryPolicy() and plain.default_retry

    apply_retry_defaults(ai, None, None)
    assert plain.retry == RetryPolicy()
    apply_retry_defaults(ai, 6, 1.5)
    assert (plain.retry.max_attempts, plain.retry.initial_delay) == (6, 1.5)
    assert plain.retry.max_delay == RetryPolicy().max_delay
    assert counted.retry == RetryPolicy(max_attempts=2)
    assert tuned.retry is own


def test_models_are_described_without_keys() -> None:
    """The scripted model is "scripted"; an adapter shows its provider, model and base URL
    with neither the key nor credentials or a query that could carry one."""
    assert describe_model(ScriptedModel()) == ("scripted", "scripted", None)
    openai_model = OpenAIChatModel(
        "gpt-4o-mini",
        api_key="sk-secret-key",
        base_url="https://user:hunter2@llm.example:8443/v1?api-key=sk-query-key",
    )
    provider, name, base_url = describe_model(openai_model)
    assert (provider, name) == ("openai", "gpt-4o-mini")
    assert base_url is not None and base_url.startswith("https://llm.example:8443/v1")
    for secret in ("sk-secret-key", "hunter2", "sk-query-key", "user"):
        assert secret not in base_url
    anthropic_model = AnthropicModel("claude-x", api_key="sk-ant-secret")
    assert describe_model(anthropic_model)[:2] == ("anthropic", "claude-x")
    assert "sk-ant-secret" not in str(describe_model(anthropic_model))


def test_the_store_pool_size_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """TURNSTILE_DB_POOL_SIZE (what `turnstile worker` sets) sizes a store built without
    pool_size; an explicit pool_size wins; a bad value is refused by name. Building a
    PostgreSQL store opens no connection."""
    monkeypatch.delenv(POOL_SIZE_ENV, raising=False)
    assert default_pool_size() == 10
    monkeypatch.setenv(POOL_SIZE_ENV, "3")
    assert default_pool_size() == 3
    url = "postgresql://nobody@127.0.0.1:1/never_opened"
    assert SqlSessionStore(url).db.engine.pool.size() == 3  # type: ignore[attr-defined]
    assert SqlSessionStore(url, pool_size=5).db.engine.pool.size() == 5  # type: ignore[attr-defined]
    for bad in ("0", "many", "-2"):
        monkeypatch.setenv(POOL_SIZE_ENV, bad)
        with pytest.raises(ValueError, match="TURNSTILE_DB_POOL_SIZE must be a whole number"):
            default_pool_size()


def test_engine_settings_the_app_did_not_take_are_named(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A version or warning time set in the environment that the app's engine was built
    without is logged as a warning naming the variable; an app passing its settings is not."""
    from stores.settings import read_settings
    from workers.cli.startup import warn_unused_settings

    monkeypatch.setenv("TURNSTILE_APP_VERSION", "v2")
    monkeypatch.setenv("TURNSTILE_UNCLAIMED_WARNING", "5")
    monkeypatch.delenv("TURNSTILE_STATE_KEYS", raising=False)
    settings = read_settings()
    unaware = Engine(model=ScriptedModel())
    with caplog.at_level(logging.WARNING, logger="turnstile.cli"):
        assert warn_unused_settings(unaware, settings) == [
            "TURNSTILE_APP_VERSION",
            "TURNSTILE_UNCLAIMED_WARNING",
        ]
    assert "TURNSTILE_APP_VERSION is set, but the app's Engine was not given it" in caplog.text
    passing = Engine(model=ScriptedModel(), **settings.engine_options())
    assert warn_unused_settings(passing, settings) == []


def test_worker_hands_its_settings_to_the_app_until_it_returns(
    app_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """At import the app module finds --db and the worker's pool size in current_settings()
    and in the stores' defaults; once the command returns the environment rules again."""
    from stores.settings import current_settings

    monkeypatch.setenv("TURNSTILE_APP_VERSION", "v9")
    monkeypatch.delenv("TURNSTILE_DB_POOL_SIZE", raising=False)
    (app_dir / "probe_app.py").write_text(
        textwrap.dedent(
            """
            import stores
            from stores.settings import current_settings
            from stores.sql import default_pool_size

            SEEN = current_settings()
            DEFAULTS = (stores.default_url(), default_pool_size())
            ai = "not an engine"
            """
        )
    )
    argv = ["worker", "--app", "probe_app:ai", "--db", "sqlite:///probe.db", "--concurrency", "6"]
    assert main(argv) == 2
    seen = sys.modules["probe_app"].SEEN
    assert (seen.database_url, seen.db_pool_size, seen.app_version) == (
        "sqlite:///probe.db",
        5,
        "v9",
    )
    assert sys.modules["probe_app"].DEFAULTS == ("sqlite:///probe.db", 5)
    monkeypatch.setenv("TURNSTILE_DATABASE_URL", "sqlite:///after.db")
    assert current_settings().database_url == "sqlite:///after.db"
    assert "not an engine.Engine" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_a_bad_setting_stops_a_command_naming_its_variable(
    app_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """A variable of the settings that does not parse is a refusal (exit 2) that names it,
    before the app is imported, without a traceback."""
    monkeypatch.setenv("TURNSTILE_UNCLAIMED_WARNING", "soon")
    assert main([command, "--app", "probe_app:ai", "--db", "sqlite:///probe.db"]) == 2
    err = capsys.readouterr().err
    assert "TURNSTILE_UNCLAIMED_WARNING must be a number of seconds" in err
    assert "Traceback" not in err
    assert "probe_app" not in sys.modules
