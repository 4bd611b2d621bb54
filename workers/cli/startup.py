"""What ``turnstile worker`` and ``turnstile serve`` do before they serve: resolve the
database URL, import the app, check that its agents use that database and that the schema is
at head (waiting for a database that cannot be reached yet), apply the command line's retry
policy, and say what they are about to run.

Failures are :class:`CommandFailed` with the exit status they stand for: a refusal the
operator must fix (exit 2, :class:`Refused`) or a database that stayed unreachable (exit 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit, urlunsplit

import click

from engine import Engine
from engine.model import Model
from engine.remote.imports import import_attribute
from stores.database import redact
from workers.cli.params import DATABASE_URL_ENV, DEFAULT_DB_URL
from workers.logs import configure_logging
from workers.observers import PoolObserver

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from stores.settings import Settings

__all__ = [
    "AppFlags",
    "CommandFailed",
    "DatabaseUnreachable",
    "Refused",
    "ReportingCommand",
    "TurnstileCommand",
    "apply_retry_defaults",
    "call_store_hook",
    "check_at_head",
    "check_auth",
    "check_keys",
    "check_same_database",
    "configure_process",
    "describe_model",
    "durable",
    "export_environment",
    "hand_down",
    "load_app",
    "load_attr",
    "load_checked_app",
    "load_observer",
    "load_settings",
    "log_models",
    "resolve_db_url",
    "store_hook",
    "warn_unused_settings",
    "worker_pool_size",
]

#: The first pause between connection attempts at start; it doubles up to the maximum.
CONNECT_RETRY_DELAY = 0.5
MAX_CONNECT_RETRY_DELAY = 2.0

logger = logging.getLogger("turnstile.cli")


class CommandFailed(Exception):
    """A command cannot go on: reported on stderr, without a traceback, as this status."""

    exit_status = 1


class Refused(CommandFailed):
    """A usage error or a refusal the operator must fix (exit status 2)."""

    exit_status = 2


class DatabaseUnreachable(CommandFailed):
    """The database could not be reached within the connect timeout (exit status 1)."""

    exit_status = 1


#: The ``error.kind`` of a ``--json`` failure, by exit status.
FAILURE_KINDS = {1: "refused", 2: "usage"}


def emit_failure(command: str, failure: CommandFailed) -> None:
    """``{"error": {"command", "kind", "exit_status", "message"}}`` on standard output."""
    error = {
        "command": command,
        "kind": FAILURE_KINDS.get(failure.exit_status, "failed"),
        "exit_status": failure.exit_status,
        "message": str(failure),
    }
    sys.stdout.write(json.dumps({"error": error}, ensure_ascii=False) + "\n")


class ReportingCommand(click.Command):
    """A command (mixed into a group: the group's own callback) whose :class:`CommandFailed`
    is reported as ``<name>: <message>`` on stderr and returned as its exit status, never
    as a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CommandFailed as exc:
            click.echo(f"{self.failure_name(ctx)}: {exc}", err=True)
            if ctx.params.get("as_json"):
                # A script reading --json output gets the failure in the same form.
                emit_failure(self.failure_name(ctx), exc)
            return exc.exit_status

    def failure_name(self, ctx: click.Context) -> str:
        """How a failure's line names the command: its path (``turnstile turns ls``)."""
        return ctx.command_path


class TurnstileCommand(ReportingCommand):
    """A ``turnstile`` command: its callback returns the exit status, and a
    :class:`CommandFailed` it raises is reported as ``turnstile <command>: <message>`` on
    stderr with that failure's status (Ctrl-C: 130), never as a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            return 130

    def failure_name(self, ctx: click.Context) -> str:
        return f"turnstile {ctx.info_name}"


def resolve_db_url(
    arg: str | None, settings: Settings | None = None, *, existing: bool = False
) -> str:
    """The database URL: ``arg`` (``--db``, or ``TURNSTILE_DATABASE_URL`` through it), else
    the settings' (``settings``, else the process's: ``TURNSTILE_DATABASE_URL``, else the
    SQLite default, whose ``.turnstile/`` folder is created). Refuses a URL that is neither
    PostgreSQL nor SQLite. ``existing``: the command only uses a database that is there (an
    operator's read or action), so an SQLite file that does not exist is a failure naming
    it, and nothing is created."""
    url = arg or (settings or load_settings()).database_url
    from stores.database import normalise_url

    try:
        parsed = normalise_url(url)
    except Exception as exc:  # SQLAlchemy's ArgumentError for text that is no URL at all
        raise Refused(f"--db {redact(url)}: {exc}") from exc
    path = parsed.database if parsed.get_backend_name() == "sqlite" else None
    if existing and path and path != ":memory:" and not Path(path).exists():
        raise CommandFailed(
            f"no database at {path} (in {Path.cwd()}): run `turnstile migrate` to create "
            "one, or point --db or TURNSTILE_DATABASE_URL at yours"
        )
    if url == DEFAULT_DB_URL:
        Path(".turnstile").mkdir(exist_ok=True)
    return url


def hand_down(settings: Settings, url: str, pool_size: int | None) -> Settings:
    """Hand the command's settings to the app it is about to import: ``settings`` with the
    resolved database URL (and, when chosen, the stores' default pool size) become the
    process's (:func:`stores.settings.install_settings`), so ``current_settings()``,
    ``SqlSessionStore()`` and ``stores.default_url()`` in the app module give them. Until
    the command returns (``workers.cli.main`` puts back the ones before)."""
    from stores.settings import install_settings

    update: dict[str, object] = {"database_url": url}
    if pool_size is not None:
        update["db_pool_size"] = pool_size
    handed = settings.model_copy(update=update)
    install_settings(handed)
    export_environment(url, pool_size)
    return handed


def export_environment(url: str, pool_size: int | None) -> None:
    """Set the variables of the database URL and, when chosen, the stores' default pool size
    (``TURNSTILE_DB_POOL_SIZE``), for an app that reads them from ``os.environ`` itself (and
    the processes it starts): the settings :func:`hand_down` installs are what the stores
    read."""
    from stores.sql import POOL_SIZE_ENV

    os.environ[DATABASE_URL_ENV] = url
    if pool_size is not None:
        os.environ[POOL_SIZE_ENV] = str(pool_size)


def worker_pool_size(concurrency: int) -> int:
    """The store's ``pool_size`` for a worker with ``concurrency`` slots: the hot path's pool
    (twice ``pool_size``) then holds a connection per slot and three or four more for the
    claim loop, the maintenance jobs and a settle's follow-on claim."""
    return concurrency // 2 + 2


# -- the app -------------------------------------------------------------------------------


def load_attr(spec: str, option: str) -> Any:
    """``module:attribute`` → the attribute (the module imported from the current directory)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise Refused(f"{option} must look like 'module:attribute', not {spec!r}.")
    from stores.settings import InvalidSettingsError

    try:
        return import_attribute(module_name, attr)
    except InvalidSettingsError as exc:
        # The module read a setting it cannot use (a model without its key): the operator's
        # to fix, said in one line as every other refusal.
        raise Refused(str(exc)) from exc
    except ImportError as exc:
        raise Refused(f"cannot import app module {module_name!r}: {exc}") from exc
    except AttributeError as exc:
        raise Refused(f"module {module_name!r} has no attribute {attr!r}.") from exc


def load_app(spec: str) -> Engine:
    """The :class:`engine.Engine` that ``--app`` names."""
    app = load_attr(spec, "--app")
    if not isinstance(app, Engine):
        raise Refused(f"{spec} is a {type(app).__name__}, not an engine.Engine.")
    return app


def load_observer(spec: str) -> PoolObserver:
    """The :class:`workers.observers.PoolObserver` that ``--observer`` names."""
    observer = load_attr(spec, "--observer")
    if not callable(getattr(observer, "turn_claimed", None)) or not callable(
        getattr(observer, "turn_finished", None)
    ):
        raise Refused(
            f"{spec} is a {type(observer).__name__}, not a pool observer "
            "(turn_claimed and turn_finished methods)."
        )
    return cast(PoolObserver, observer)


def durable(app: Engine) -> bool:
    """Whether any agent keeps its turns in a database (then there is a schema to check)."""
    return any(agent.store is not None and agent.store.durable for agent in app.agents.values())


def check_same_database(app: Engine, url: str) -> None:
    """Refuse an app whose agents keep their turns in another database than ``url``: the
    process would check, claim from and report on one database while the app writes another."""
    from stores.database import normalise_url

    wanted = _database_identity(normalise_url(url))
    elsewhere: list[str] = []
    for agent in app.agents.values():
        store = agent.store
        store_url = getattr(store, "url", None) if store is not None and store.durable else None
        if store_url is not None and _database_identity(normalise_url(store_url)) != wanted:
            elsewhere.append(f"agent '{agent.name}' keeps its turns in {redact(store_url)}")
    if elsewhere:
        raise Refused(
            f"refusing to start: {'; '.join(elsewhere)}, not in the database of --db "
            f"({redact(url)}). Build the app's store from the settings the command hands "
            "it (--db, installed before the app is imported: SqlSessionStore() with no URL, "
            "stores.default_url() or current_settings().database_url; also exported as "
            f"{DATABASE_URL_ENV}), or pass --db with the app's database."
        )


def _database_identity(url: URL) -> tuple[str, ...]:
    """What tells two normalised URLs' databases apart: the file for SQLite, the server
    and database name for PostgreSQL (user and password may differ)."""
    if url.get_backend_name() == "sqlite":
        database = url.database or ":memory:"
        if database != ":memory:":
            database = str(Path(database).resolve())
        return ("sqlite", database)
    host = url.query.get("host") or url.host or ""
    return ("postgresql", str(host), str(url.port or 5432), str(url.database or ""))


def apply_retry_defaults(app: Engine, max_attempts: int | None, backoff: float | None) -> None:
    """Give every agent defined without a retry policy the command line's attempts and first
    backoff (agents with ``max_attempts=`` or ``retry=`` keep theirs)."""
    if max_attempts is None and backoff is None:
        return
    for agent in app.agents.values():
        if not agent.default_retry:
            continue
        policy = agent.retry
        if max_attempts is not None:
            policy = dataclasses.replace(policy, max_attempts=max_attempts)
        if backoff is not None:
            policy = dataclasses.replace(policy, initial_delay=backoff)
        agent.retry = policy


def load_settings() -> Settings:
    """The process's settings (:func:`stores.settings.current_settings`); a variable whose
    value does not parse is a refusal naming it."""
    from stores.settings import InvalidSettingsError, current_settings

    try:
        return current_settings()
    except InvalidSettingsError as exc:
        raise Refused(str(exc)) from exc


def configure_tracing(settings: Settings) -> None:
    """Export spans as the settings' ``OTEL_*`` variables say (nothing when none is set); a
    configuration that cannot be served (an unknown exporter, a missing package) is refused."""
    from engine.telemetry.tracing import TracingConfigError
    from engine.telemetry.tracing import configure_tracing as install

    try:
        install(settings.tracing_config())
    except TracingConfigError as exc:
        raise Refused(str(exc)) from exc


def warn_unused_settings(app: Engine, settings: Settings) -> list[str]:
    """Warn of each engine setting the environment gives that the app's engine did not take
    (the engine reads no environment: the app passes them, as
    ``Engine(model=..., **current_settings().engine_options())`` does); the variables named."""
    unused: list[str] = []
    client_managed = [agent for agent in app.agents.values() if agent.store is None]
    if settings.state_keys and any(agent.signer.generated for agent in client_managed):
        unused.append("TURNSTILE_STATE_KEYS")
    if settings.state_max_age is not None and any(
        agent.signer.max_age != settings.state_max_age for agent in client_managed
    ):
        unused.append("TURNSTILE_STATE_MAX_AGE")
    if settings.app_version is not None and app.version != settings.app_version:
        unused.append("TURNSTILE_APP_VERSION")
    set_here = "unclaimed_warning" in settings.model_fields_set  # its default is the engine's
    if set_here and app.unclaimed_warning != settings.unclaimed_warning:
        unused.append("TURNSTILE_UNCLAIMED_WARNING")
    for variable in unused:
        logger.warning(
            "%s is set, but the app's Engine was not given it: build the engine with "
            "Engine(model=..., **current_settings().engine_options()) (stores.settings) to "
            "use it",
            variable,
            extra={"variable": variable},
        )
    return unused


def check_auth(auth: object, spec: str, *, dev: bool) -> None:
    """Refuse an authenticator whose tokens are published (marked ``demo_only``, as the
    README's ``examples.demo_auth:auth``) unless ``dev``: anyone could sign in with them."""
    from engine.remote.auth import is_demo_only

    if not is_demo_only(auth):
        return
    if not dev:
        raise Refused(
            f"refusing to start: --auth {spec} is a demo authenticator whose tokens are "
            "published; give --dev for a local demo, or an authenticator of your own"
        )
    logger.warning(
        "--auth %s: a demo authenticator whose tokens are published (accepted with --dev)",
        spec,
        extra={"auth": spec},
    )


def check_keys(app: Engine, *, dev: bool) -> list[str]:
    """Refuse client-managed agents whose state anyone could forge (unless ``dev``); the key
    ids in use, logged."""
    from engine.errors import InsecureKeyError
    from engine.state.signing import check_deployable_keys

    try:
        key_ids = check_deployable_keys(app, dev=dev)
    except InsecureKeyError as exc:
        raise Refused(f"refusing to start: {exc}") from exc
    if key_ids:
        logger.info(
            "client-managed state signed with key %s (verifying: %s)",
            key_ids[0],
            ", ".join(key_ids),
            extra={"state_key_ids": key_ids},
        )
    return key_ids


@dataclasses.dataclass(frozen=True)
class AppFlags:
    """The options ``turnstile worker`` and ``turnstile serve`` share, parsed: the app, its
    database, logging, the retry policy of agents without one (``docs/configuration.md``)."""

    app: str
    db: str | None
    connect_timeout: float
    log_level: str
    log_format: str
    max_attempts: int | None
    retry_backoff: float | None
    db_pool_size: int | None
    dev: bool


def configure_process(flags: AppFlags) -> Settings:
    """Log as ``flags`` say and trace as the settings say; the process's settings."""
    configure_logging(flags.log_level, flags.log_format)
    settings = load_settings()
    configure_tracing(settings)
    return settings


def load_checked_app(
    flags: AppFlags, settings: Settings, pool_size: int | None
) -> tuple[Engine, str, Settings]:
    """Resolve the database URL, hand ``settings`` down with it and ``pool_size``, import
    the app and check it (retry defaults applied, same database, settings it did not take,
    deployable keys; with ``--dev``, lenient pinning); the app, the URL and the settings
    handed down."""
    url = resolve_db_url(flags.db, settings)
    settings = hand_down(settings, url, pool_size)  # what the app module reads at import
    app = load_app(flags.app)
    apply_retry_defaults(app, flags.max_attempts, flags.retry_backoff)
    check_same_database(app, url)
    warn_unused_settings(app, settings)
    check_keys(app, dev=flags.dev)
    if flags.dev:
        allow_prompt_edits(app)
    return app, url, settings


def allow_prompt_edits(app: Engine) -> None:
    """``--dev``: make the app's pinning lenient, so a turn paused before an edit of a
    prompt (or a model, a description) resumes after it, with a warning; a change to a tool
    or a schema is still refused."""
    app.lenient_pinning = True
    if app.version is not None:
        logger.info(
            "--dev: turns paused under another definition of version %s resume if their "
            "tools and schemas are unchanged",
            app.version,
        )


# -- what runs -------------------------------------------------------------------------------


def describe_model(model: Model) -> tuple[str, str, str | None]:
    """``(provider, model, base URL)`` of a model, never a key: ``scripted`` for the
    scripted model; for a provider adapter its SDK client's base URL, without credentials,
    query or fragment."""
    from engine.scripted import ScriptedModel

    if isinstance(model, ScriptedModel):
        return "scripted", "scripted", None
    provider = getattr(model, "provider", None)
    name = getattr(model, "model", None)
    if not isinstance(provider, str) or not isinstance(name, str):
        full = str(model.name)
        provider, _, name = full.partition(":") if ":" in full else (full, "", full)
    client = getattr(model, "client", None)
    base = getattr(client, "base_url", None) or getattr(model, "base_url", None)
    return provider, name, _safe_base_url(str(base)) if base else None


def _safe_base_url(url: str) -> str:
    """``url`` without its user info, query and fragment (any of which may carry a key)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def log_models(agents: Any) -> None:
    """One line per agent: its model's provider, name and base URL."""
    for agent in agents:
        provider, name, base_url = describe_model(agent.model)
        logger.info(
            "agent %s: model %s from %s%s",
            agent.name,
            name,
            provider,
            f" at {base_url}" if base_url else "",
            extra={
                "agent": agent.name,
                "model_provider": provider,
                "model": name,
                "model_base_url": base_url,
            },
        )


# -- the schema -----------------------------------------------------------------------------


def store_hook(name: str) -> Callable[[str], Any] | None:
    """``stores.<name>`` (``migrate``, ``ensure_at_head``) if the installed stores package
    provides it, looked up when called."""
    import stores

    hook = getattr(stores, name, None)
    return hook if callable(hook) else None


def call_store_hook(hook: Callable[[str], Any], url: str) -> None:
    """Call a sync or async store hook, outside any event loop (Alembic may start its own)."""
    result = hook(url)
    if inspect.iscoroutine(result):
        asyncio.run(result)


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) means the database could not be reached — refused,
    starting up, recovering, timed out — rather than that it answered and was found wanting."""
    import sqlite3

    import psycopg
    import sqlalchemy.exc

    kinds = (
        sqlalchemy.exc.OperationalError,
        psycopg.OperationalError,
        sqlite3.OperationalError,
        ConnectionError,
        TimeoutError,
        socket.gaierror,
    )
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kinds):
            return True
        seen = seen.__cause__
    return False


def _reason(exc: BaseException) -> str:
    """The driver's own message for ``exc``, on one line."""
    orig = getattr(exc, "orig", None)  # SQLAlchemy's wrapper adds SQL and a link to its docs
    return " ".join(str(orig if isinstance(orig, BaseException) else exc).split())


@contextlib.contextmanager
def _attempt_timeout(seconds: float) -> Iterator[None]:
    """Bound each connection attempt by the wait left (at most 10 s, libpq's minimum 2 s):
    otherwise one attempt on a host that drops packets could outlast the whole wait."""
    if load_settings().pgconnect_timeout is not None:
        yield
        return
    os.environ["PGCONNECT_TIMEOUT"] = str(max(2, min(10, int(seconds + 1))))
    try:
        yield
    finally:
        del os.environ["PGCONNECT_TIMEOUT"]


def check_at_head(url: str, connect_timeout: float) -> None:
    """Refuse to start unless the schema is at head, waiting with backoff for up to
    ``connect_timeout`` seconds while the database cannot be reached."""
    check = store_hook("ensure_at_head")
    if check is None:
        return
    started = time.monotonic()
    deadline = started + connect_timeout
    delay = CONNECT_RETRY_DELAY
    waited = False
    while True:
        try:
            with _attempt_timeout(deadline - time.monotonic()):
                call_store_hook(check, url)
        except Exception as exc:
            if not _unreachable(exc):
                raise Refused(f"refusing to start: {exc}") from exc
            left = deadline - time.monotonic()
            if left <= 0:
                raise DatabaseUnreachable(
                    f"database {redact(url)} not reachable after {connect_timeout:g}s "
                    f"({_reason(exc)}); giving up (see --connect-timeout)"
                ) from exc
            pause = min(delay, left)
            logger.warning(
                "database %s not reachable (%s); retrying in %.1fs",
                redact(url),
                _reason(exc),
                pause,
            )
            waited = True
            time.sleep(pause)
            delay = min(2 * delay, MAX_CONNECT_RETRY_DELAY)
            continue
        if waited:
            logger.info(
                "database %s reachable after %.1fs", redact(url), time.monotonic() - started
            )
        return
