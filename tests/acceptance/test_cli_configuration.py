"""The ``turnstile`` command as a deployment runs it: options from the environment and their
precedence, usage errors, JSON logs that name the turn they are about, the refusal of an app
whose store is on another database, ``postgres://`` URLs, and the wiring of ``serve``'s
inbox policy and ``--dev``.

Every command is a real ``python -m workers.cli`` process, on a real SQLite file or
PostgreSQL database; the apps are small modules written into the test's directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from engine import Engine, ScriptedModel
from stores import SqlSessionStore
from tests.acceptance import durable_app
from tests.databases import new_sqlite_database, postgres_url
from tests.http_support import free_port, serve_process

ROOT = Path(__file__).resolve().parents[2]

#: A durable agent whose store is built from TURNSTILE_DATABASE_URL, as an app should.
QUEUED_APP = """
from engine import Engine, ScriptedModel
from stores import SqlSessionStore

ai = Engine(model=ScriptedModel())
ai.define_agent(name="echoAgent", store=SqlSessionStore(), execution="workers")
"""

#: The same agent, on a database of its own choosing (not --db).
ELSEWHERE_APP = """
from engine import Engine, ScriptedModel
from stores import SqlSessionStore

ai = Engine(model=ScriptedModel())
ai.define_agent(name="echoAgent", store=SqlSessionStore("sqlite:///elsewhere.db"))
"""

#: An agent whose sessions live in the server's memory: no database at all.
MEMORY_APP = """
from engine import Engine, ScriptedModel
from stores import InMemorySessionStore

ai = Engine(model=ScriptedModel())
ai.define_agent(name="echoAgent", store=InMemorySessionStore())
"""

#: An agent whose state travels signed with the client, with no key configured.
CLIENT_STATE_APP = """
from engine import Engine, ScriptedModel

ai = Engine(model=ScriptedModel())
ai.define_agent(name="statelessAgent")
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a command: ours without any TURNSTILE_* setting, the repository
    and the test's directory importable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path)])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_turnstile(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a ``turnstile`` command to its end in ``tmp_path``."""
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=tmp_path,
        env=env if env is not None else _env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class Running:
    """A ``turnstile`` process running in the background, its output in a file."""

    def __init__(self, tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
        self.log_path = tmp_path / f"turnstile-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", *args],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        """Everything the process wrote so far."""
        return self.log_path.read_text(errors="replace")

    def json_lines(self) -> list[dict[str, Any]]:
        """Every line written so far, each parsed as JSON (a line that is not fails)."""
        return [json.loads(line) for line in self.output().splitlines() if line.strip()]

    def wait_for(self, what: str, found: Callable[[], bool], timeout: float = 30) -> None:
        """Wait until ``found()``; fails with the output if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while not found():
            assert self.process.poll() is None, f"exited before {what}:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {what} after {timeout}s:\n{self.output()}"
            time.sleep(0.1)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if need be; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()
        return self.process.returncode


@contextlib.contextmanager
def running(tmp_path: Path, *args: str, env: dict[str, str]) -> Iterator[Running]:
    """A background ``turnstile`` process for the block (stopped, its output printed, after)."""
    process = Running(tmp_path, list(args), env)
    try:
        yield process
    finally:
        process.stop()
        print(process.output())


def write_app(tmp_path: Path, name: str, source: str) -> str:
    """Write an app module into ``tmp_path``; its ``module:ai`` spec."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    return f"{name}:ai"


# -- usage errors and precedence (no database needed: each stops before opening one) ---------------


def test_an_option_reads_its_environment_variable_and_a_flag_wins_over_it(
    tmp_path: Path,
) -> None:
    """TURNSTILE_APP stands in for --app, and --app given as well wins; a bad value in
    TURNSTILE_CONCURRENCY is a usage error naming the variable unless --concurrency overrides
    it. Each run stops at importing the (missing) app, after the options were read."""
    env = _env(tmp_path, TURNSTILE_APP="from_env_module:ai")
    from_env = run_turnstile(tmp_path, "worker", env=env)
    assert from_env.returncode == 2
    assert "cannot import app module 'from_env_module'" in from_env.stderr

    from_flag = run_turnstile(tmp_path, "worker", "--app", "from_flag_module:ai", env=env)
    assert "cannot import app module 'from_flag_module'" in from_flag.stderr

    bad_env = _env(tmp_path, TURNSTILE_APP="missing:ai", TURNSTILE_CONCURRENCY="many")
    refused = run_turnstile(tmp_path, "worker", env=bad_env)
    assert refused.returncode == 2
    assert "Invalid value for '--concurrency'" in refused.stderr
    assert "TURNSTILE_CONCURRENCY" in refused.stderr
    assert "expected a whole number >= 1, not 'many'" in refused.stderr
    assert "Traceback" not in refused.stderr

    overridden = run_turnstile(tmp_path, "worker", "--concurrency", "2", env=bad_env)
    assert overridden.returncode == 2
    assert "cannot import app module 'missing'" in overridden.stderr


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["worker", "--app", "x:y", "--log-level", "LOUD"], "'LOUD' is not one of"),
        (["serve", "--app", "x:y", "--log-format", "xml"], "'xml' is not one of"),
        (["worker", "--app", "x:y", "--max-attempts", "0"], "expected a whole number >= 1"),
        (["worker", "--app", "x:y", "--retry-backoff", "soon"], "expected a number of seconds"),
        (["serve", "--app", "x:y", "--port", "99999"], "expected a port number 0-65535"),
        (["worker"], "Missing option '--app'"),
        (["worker", "--app", "x:y", "--no-such-flag"], "No such option '--no-such-flag'"),
        (["launch"], "No such command 'launch'"),
        (["worker", "--app", "x:y", "--db", "mysql://h/db"], "Unsupported database"),
    ],
)
def test_usage_errors_exit_2_with_a_message_and_no_traceback(
    tmp_path: Path, args: list[str], complaint: str
) -> None:
    done = run_turnstile(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    assert complaint in done.stderr
    assert "Traceback" not in done.stderr


def test_a_usage_error_in_the_environment_is_reported_like_a_flag(tmp_path: Path) -> None:
    """TURNSTILE_LOG_FORMAT=xml fails as --log-format xml would."""
    done = run_turnstile(
        tmp_path, "serve", "--app", "x:y", env=_env(tmp_path, TURNSTILE_LOG_FORMAT="xml")
    )
    assert done.returncode == 2
    assert "Invalid value for '--log-format'" in done.stderr
    assert "TURNSTILE_LOG_FORMAT" in done.stderr


# -- the store on another database -----------------------------------------------------------------


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_an_app_whose_store_is_on_another_database_is_refused(tmp_path: Path, command: str) -> None:
    """The app keeps its turns in elsewhere.db while --db names another file: exit 2 with a
    message naming both and what to do, before any turn is claimed or served."""
    app = write_app(tmp_path, "elsewhere_app", ELSEWHERE_APP)
    url = new_sqlite_database()
    done = run_turnstile(tmp_path, command, "--app", app, "--db", url)
    assert done.returncode == 2, done.stderr
    assert "agent 'echoAgent' keeps its turns in sqlite:///elsewhere.db" in done.stderr
    assert f"not in the database of --db ({url})" in done.stderr
    assert "TURNSTILE_DATABASE_URL" in done.stderr
    assert "Traceback" not in done.stderr


# -- JSON logs -------------------------------------------------------------------------------------


async def test_worker_json_logs_name_the_turn_and_report_the_configuration(
    tmp_path: Path,
) -> None:
    """A worker configured only through TURNSTILE_* variables logs JSON lines: each parses,
    carries ts/level/logger/message, the startup lines name the model and the settings from
    the environment (no password), and every line about the turn it ran carries turn_id,
    session_id and agent."""
    url = new_sqlite_database()
    app = write_app(tmp_path, "queued_app", QUEUED_APP)
    env = _env(
        tmp_path,
        TURNSTILE_APP=app,
        TURNSTILE_DATABASE_URL=url,
        TURNSTILE_LOG_FORMAT="json",
        TURNSTILE_CONCURRENCY="3",
        TURNSTILE_POLL_INTERVAL="0.2",
        TURNSTILE_SHUTDOWN_GRACE="1",
    )
    with running(tmp_path, "worker", env=env) as worker:
        worker.wait_for("the pool", lambda: "serving" in worker.output())
        ai = Engine(model=ScriptedModel())
        store = SqlSessionStore(url)
        agent = ai.define_agent(name="echoAgent", store=store, execution="workers")
        try:
            response = await agent.chat().send("hello")
        finally:
            await store.close()
        turn_id = response.snapshot_id
        assert turn_id is not None
        worker.wait_for("the settle line", lambda: f"turn {turn_id} attempt 1 " in worker.output())
        assert worker.stop() == 0
        lines = worker.json_lines()

    for line in lines:
        assert {"ts", "level", "logger", "message"} <= line.keys(), line
    model = next(line for line in lines if line.get("model_provider"))
    assert (model["agent"], model["model_provider"], model["model"]) == (
        "echoAgent",
        "scripted",
        "scripted",
    )
    started = next(line for line in lines if line.get("db_pool_size") is not None)
    assert (started["concurrency"], started["db_pool_size"]) == (3, 3)
    assert started["database"] == url
    about_turn = [line for line in lines if turn_id in line["message"]]
    assert len(about_turn) >= 2, lines  # claimed, then settled
    for line in about_turn:
        assert line["turn_id"] == turn_id
        assert line["session_id"] == response.session_id
        assert line["agent"] == "echoAgent"


def test_serve_logs_uvicorn_and_its_own_lines_in_one_json_format(tmp_path: Path) -> None:
    """uvicorn's lines (startup, access) come out as JSON through the same handler as
    Turnstile's, and the flag --log-format wins over TURNSTILE_LOG_FORMAT."""
    app = write_app(tmp_path, "memory_app", MEMORY_APP)
    port = free_port()
    env = _env(tmp_path, TURNSTILE_LOG_FORMAT="text", TURNSTILE_PORT=str(port))
    with running(tmp_path, "serve", "--app", app, "--log-format", "json", env=env) as server:
        base = f"http://127.0.0.1:{port}"
        server.wait_for("the server", lambda: "Uvicorn running" in server.output())
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        server.wait_for("the access line", lambda: "/healthz" in server.output())
        server.stop()  # uvicorn ends by re-raising SIGTERM: no exit status of ours to check
        lines = server.json_lines()
    loggers = {line["logger"] for line in lines}
    assert {"uvicorn.error", "uvicorn.access", "turnstile.cli"} <= loggers
    assert any(
        line["logger"] == "uvicorn.access" and "/healthz" in line["message"] for line in lines
    )


# -- postgres:// and the inbox policy --------------------------------------------------------------


def test_migrate_accepts_a_postgres_scheme_url(tmp_path: Path) -> None:
    """``postgres://`` (as Heroku and many hosts write it) works like ``postgresql://``."""
    with postgres_url() as url:
        plain = make_url(url).set(drivername="postgres").render_as_string(hide_password=False)
        done = run_turnstile(tmp_path, "migrate", "--db", plain)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("database at head: postgres://")


def test_serve_refuses_a_bad_inbox_policy_and_accepts_a_role(tmp_path: Path) -> None:
    """--inbox-policy goes through engine.remote.auth.inbox_policy_from_spec: a spec it
    refuses is a usage error; role:NAME serves."""
    app = write_app(tmp_path, "inbox_app", MEMORY_APP)
    refused = run_turnstile(tmp_path, "serve", "--app", app, "--inbox-policy", "everyone")
    assert refused.returncode == 2
    assert "--inbox-policy" in refused.stderr and "'everyone'" in refused.stderr
    assert "Traceback" not in refused.stderr

    port = free_port()
    env = _env(tmp_path, TURNSTILE_INBOX_POLICY="role:approver")
    with running(tmp_path, "serve", "--app", app, "--port", str(port), env=env) as server:
        server.wait_for("the server", lambda: "Uvicorn running" in server.output())
        assert httpx.get(f"http://127.0.0.1:{port}/inbox", timeout=5).status_code == 200


def test_client_managed_state_without_a_key_is_refused_unless_dev(tmp_path: Path) -> None:
    """A client-managed agent with no configured signing key stops ``serve`` (exit 2, the
    key check's message); TURNSTILE_DEV=1 lets it serve and logs the key id it signs with."""
    app = write_app(tmp_path, "client_state_app", CLIENT_STATE_APP)
    refused = run_turnstile(tmp_path, "serve", "--app", app)
    assert refused.returncode == 2
    assert "refusing to start" in refused.stderr and "statelessAgent" in refused.stderr
    assert "Traceback" not in refused.stderr

    port = free_port()
    env = _env(tmp_path, TURNSTILE_DEV="1", TURNSTILE_PORT=str(port))
    with running(tmp_path, "serve", "--app", app, env=env) as server:
        server.wait_for("the server", lambda: "Uvicorn running" in server.output())
        assert "client-managed state signed with key ephemeral-" in server.output()


def test_the_example_key_is_refused_without_dev(tmp_path: Path) -> None:
    """The banking example signs with a key published in this repository: ``worker`` and
    ``serve`` stop before touching the database, naming the key."""
    url = new_sqlite_database()
    for command in ("worker", "serve"):
        done = run_turnstile(
            tmp_path, command, "--app", "examples.banking:ai", "--db", url, "--connect-timeout", "0"
        )
        assert done.returncode == 2, done.stderr
        assert "'example-only'" in done.stderr and "bankingAgentStateless" in done.stderr
        assert "Traceback" not in done.stderr


def test_a_short_key_or_one_of_the_suites_is_refused_without_dev(tmp_path: Path) -> None:
    """A one-byte key, and the keys written in this test suite (public like the examples'),
    stop ``serve`` naming the key and why; ``--dev`` lets the short key serve."""
    url = new_sqlite_database()
    suite_key = ",".join(f"{kid}:{secret}" for kid, secret in durable_app.STATE_KEYS.items())
    serve = ("serve", "--app", "examples.banking:ai", "--db", url)
    for keys, why in (("tiny:x", "shorter than 32 bytes ('tiny')"), (suite_key, "published")):
        done = run_turnstile(tmp_path, *serve, env=_env(tmp_path, TURNSTILE_STATE_KEYS=keys))
        assert done.returncode == 2, done.stderr
        assert why in done.stderr and "bankingAgentStateless" in done.stderr
        assert "Traceback" not in done.stderr
        assert keys.partition(":")[2] not in done.stderr

    port = free_port()
    env = _env(tmp_path, TURNSTILE_STATE_KEYS="tiny:x", TURNSTILE_DEV="1")
    with running(tmp_path, *serve, "--port", str(port), env=env) as server:
        server.wait_for("the server", lambda: "Uvicorn running" in server.output())
        assert "client-managed state signed with key tiny" in server.output()


def test_max_turns_per_principal_from_the_environment_refuses_the_next_turn(
    tmp_path: Path,
) -> None:
    """TURNSTILE_MAX_TURNS_PER_PRINCIPAL=1 reaches create_app: with one detached turn in
    flight (no worker runs it), the caller's next turn gets 429 with Retry-After."""
    url = new_sqlite_database()
    limit = {"TURNSTILE_MAX_TURNS_PER_PRINCIPAL": "1"}
    with serve_process(url, workers=0, env=limit) as (base, _process):
        message = {"role": "user", "content": [{"text": "hello"}]}
        first = httpx.post(
            f"{base}/api/bankingAgent",
            json={"data": {"message": message, "detach": True}, "init": {}},
            timeout=10,
        )
        assert first.status_code == 200, first.text
        second = httpx.post(
            f"{base}/api/bankingAgent", json={"data": {"message": message}, "init": {}}, timeout=10
        )
    assert second.status_code == 429, second.text
    assert second.headers["retry-after"]
    assert second.json()["status"] == "RESOURCE_EXHAUSTED"


# -- tracing configuration -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_an_unusable_otel_exporter_is_refused_at_startup(tmp_path: Path, command: str) -> None:
    """OTEL_TRACES_EXPORTER naming an exporter that does not exist stops the command before it
    serves anything: exit 2, the exporter named, no traceback."""
    app = write_app(tmp_path, "stateless_app", CLIENT_STATE_APP)
    env = _env(tmp_path, OTEL_TRACES_EXPORTER="no-such-exporter")
    done = run_turnstile(tmp_path, command, "--app", app, "--db", new_sqlite_database(), env=env)
    assert done.returncode == 2, done.stderr
    assert "no-such-exporter" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("model", "missing"),
    [
        ("openai:gpt-4o-mini", "OPENAI_API_KEY"),
        ("anthropic:claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
    ],
)
@pytest.mark.parametrize("command", ["worker", "serve"])
def test_a_model_without_its_key_is_refused_in_one_line(
    tmp_path: Path, command: str, model: str, missing: str
) -> None:
    """An app that builds its model from TURNSTILE_MODEL at import, with no API key set, is
    refused with one line naming the variable and the key, exit 2, and no traceback."""
    env = _env(tmp_path, TURNSTILE_MODEL=model)
    env.pop("OPENAI_API_KEY", None)
    env.pop("ANTHROPIC_API_KEY", None)
    done = run_turnstile(
        tmp_path,
        command,
        "--app",
        "examples.banking:ai",
        "--dev",
        "--db",
        new_sqlite_database(),
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"TURNSTILE_MODEL={model!r}" in lines[0] and missing in lines[0]


@pytest.mark.parametrize("command", [["turns", "ls"], ["approvals", "ls"], ["stats"]])
def test_a_read_where_no_database_is_says_so_and_creates_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    """A read-only command in a directory with no database (and no --db) says there is none
    and how to get one, exits 1, and leaves the directory as it was."""
    done = run_turnstile(tmp_path, *command)
    assert done.returncode == 1, done.stderr
    assert "no database at .turnstile/turnstile.db" in done.stderr
    assert "turnstile migrate" in done.stderr
    assert not (tmp_path / ".turnstile").exists()


def test_a_json_command_that_fails_answers_in_json_too(tmp_path: Path) -> None:
    """With --json, a failure is also a JSON object on standard output (its kind, exit
    status and message), beside the one line on standard error."""
    done = run_turnstile(tmp_path, "approvals", "ls", "--json")
    assert done.returncode == 1
    failure = json.loads(done.stdout)["error"]
    assert failure["command"] == "turnstile approvals ls"
    assert failure["kind"] == "refused" and failure["exit_status"] == 1
    assert failure["message"].startswith("no database at")
    assert done.stderr.startswith("turnstile approvals ls: no database at")
