"""What the operator commands (``turns``, ``approvals``, ``stats``) share: their command
class, failures and exit statuses, parameter types for moments and ages, opening the store on
``--db`` and loading ``--app`` for the commands that run turns through the engine.

Exit statuses (``docs/cli.md``): 0 success; 1 not found, refused (the engine's rules said
no), or a database that cannot be read; 2 a usage error (Click's, or a value the engine finds
invalid). Every failure is one line on stderr naming what to do next, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from engine.errors import AgentError, InvalidArgumentError, NotFoundError, StoreError
from stores.database import redact
from workers.cli.params import env_name, option
from workers.cli.startup import (
    CommandFailed,
    Refused,
    TurnstileCommand,
    check_same_database,
    hand_down,
    load_app,
    load_settings,
    resolve_db_url,
)

if TYPE_CHECKING:
    from engine import Agent, Engine
    from stores.sql import SqlSessionStore

__all__ = [
    "AMBIGUITY_SHOWN",
    "SHORT_ID",
    "Age",
    "AmbiguousId",
    "Declined",
    "JsonText",
    "Moment",
    "NotFound",
    "OperatorCommand",
    "OperatorGroup",
    "json_option",
    "limit_option",
    "named_option",
    "open_app",
    "resolve_approval",
    "resolve_id",
    "run_on_app",
    "run_on_store",
    "wide_option",
]

T = TypeVar("T")

#: ``2h``, ``30m``, ``1.5d``: a number and a unit.
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
#: How many of the ids an ambiguous prefix matches its error names.
AMBIGUITY_SHOWN = 5
#: The fewest characters of a turn id a table prints (more when they are shared).
SHORT_ID = 8


class NotFound(CommandFailed):
    """What the command names does not exist (exit status 1)."""

    exit_status = 1


class Declined(CommandFailed):
    """The engine refused the action: decided already, not running, busy (exit status 1)."""

    exit_status = 1


class AmbiguousId(Refused):
    """An id prefix that starts more than one id: a usage error (exit status 2)."""


def _ambiguous(what: str, value: str, candidates: list[str]) -> AmbiguousId:
    shown = ", ".join(candidates[:AMBIGUITY_SHOWN])
    more = ", …" if len(candidates) > AMBIGUITY_SHOWN else ""
    return AmbiguousId(
        f"{value!r} starts more than one {what} id ({shown}{more}): give more characters."
    )


async def resolve_id(store: SqlSessionStore, kind: str, value: str) -> str | None:
    """The one id of ``kind`` (``turn``, ``session``, ``browser session``) that ``value`` is,
    or starts: ``None`` when none does; :class:`AmbiguousId` when several do and none is
    ``value`` itself."""
    if not value or "\x00" in value:
        return None  # PostgreSQL refuses a NUL in a parameter; no id holds one
    found = await store.ids_starting(kind, value, limit=AMBIGUITY_SHOWN + 1)
    if len(found) > 1 and found[0] != value:
        raise _ambiguous(kind, value, found)
    return found[0] if found else None


async def resolve_approval(store: SqlSessionStore, value: str) -> tuple[str, str] | None:
    """``(turn_id, ref)`` of the approval ``value`` names: ``<turn id>:<ref>`` where the
    turn id may be a prefix (``748c8e91:approval-1``), or a turn id prefix alone when that
    turn paused at one interrupt. ``None`` when none matches; :class:`AmbiguousId` when
    several do."""
    turn_prefix, colon, ref = value.partition(":")
    if not turn_prefix or (colon and not ref) or "\x00" in value:
        return None
    found = await store.approval_keys_starting(
        turn_prefix, ref if colon else None, limit=AMBIGUITY_SHOWN + 1
    )
    exact = [key for key in found if key[0] == turn_prefix]
    if len(found) > 1 and len(exact) != 1:
        raise _ambiguous("approval", value, [f"{t}:{r}" for t, r in found])
    chosen = exact or found
    return chosen[0] if chosen else None


class OperatorCommand(TurnstileCommand):
    """An operator command: a :class:`CommandFailed` is reported as ``turnstile <group>
    <command>: <message>`` on stderr with its exit status."""

    def failure_name(self, ctx: click.Context) -> str:
        return ctx.command_path


class OperatorGroup(click.Group):
    """A group of operator commands (``turns``, ``approvals``)."""

    command_class = OperatorCommand


def parse_duration(text: str) -> float | None:
    """Seconds of ``2h``-style text (``s``, ``m``, ``h``, ``d``, ``w``), else ``None``."""
    match = _DURATION.match(text)
    if match is None:
        return None
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]


class Moment(click.ParamType[datetime, Any]):
    """A moment: how long ago (``2h``, ``30m``, ``7d``) or an ISO 8601 time (UTC unless it
    names its offset)."""

    name = "since"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        text = str(value)
        seconds = parse_duration(text)
        if seconds is not None:
            return datetime.now(UTC) - timedelta(seconds=seconds)
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            self.fail(
                f"expected a duration such as 30m, 2h or 7d, or an ISO 8601 time such as "
                f"2025-01-31T08:00:00Z, not {text!r}",
                param,
                ctx,
            )
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class Age(click.ParamType[float, Any]):
    """An age: ``30m``, ``2h``, ``1d``, ``1w`` (or a number of seconds)."""

    name = "age"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
        text = str(value)
        seconds = parse_duration(text)
        if seconds is None:
            try:
                seconds = float(text)
            except ValueError:
                seconds = -1.0
        if not seconds >= 0:
            self.fail(f"expected an age such as 30m, 2h, 1d or 1w, not {text!r}", param, ctx)
        return seconds


class JsonText(click.ParamType[Any, Any]):
    """A JSON value given as text."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except ValueError as exc:
            self.fail(f"not valid JSON ({exc}): {value!r}", param, ctx)


def read_json_file(path: str) -> Any:
    """The JSON value in the file ``path`` (``-``: standard input); a usage error if it
    cannot be read or parsed."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {path}: {exc.strerror}", param_hint="--answer-file"
        ) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(
            f"{path} is not valid JSON ({exc})", param_hint="--answer-file"
        ) from None


def named_option(
    flag: str, dest: str, **settings: Any
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """``click.option(flag, dest)`` reading ``TURNSTILE_<FLAG>`` as every option does (see
    :func:`workers.cli.params.option`), for a flag whose name is no parameter name
    (``--json``, ``--from``, ``--round``)."""
    if settings.get("is_flag"):
        settings.setdefault("default", False)
        settings.setdefault("show_default", False)
    return click.option(flag, dest, envvar=env_name(flag), show_envvar=True, **settings)


def json_option(function: Callable[..., T]) -> Callable[..., T]:
    """``--json``: print the documented JSON shape instead of a table."""
    return named_option(
        "--json", "as_json", is_flag=True, help="print JSON (shape in docs/cli.md), not a table"
    )(function)


def wide_option(function: Callable[..., T]) -> Callable[..., T]:
    """``--wide``: every column, ids whole, nothing cut, instead of the readable few."""
    return named_option(
        "--wide",
        "wide",
        is_flag=True,
        help="every column, with whole ids and inputs, each line as long as it needs",
    )(function)


def limit_option(default: int, maximum: int) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """``--limit N``: at most N rows."""
    return option(
        "--limit",
        type=click.IntRange(1, maximum),
        default=default,
        help=f"at most this many rows (1-{maximum})",
    )


# -- running against the database --------------------------------------------------------


def _explain(exc: BaseException, url: str) -> CommandFailed:
    """A failure of a store call as the command reports it."""
    if isinstance(exc, NotFoundError):
        return NotFound(str(exc))
    if isinstance(exc, InvalidArgumentError):
        return Refused(str(exc))
    if isinstance(exc, StoreError):
        return CommandFailed(
            f"cannot read {redact(url)}: {' '.join(str(exc).split())} (check --db, and "
            "that `turnstile migrate` has run)"
        )
    if isinstance(exc, AgentError):
        return Declined(str(exc))
    return CommandFailed(
        f"cannot use {redact(url)}: {' '.join(str(exc).split())} (check --db and that "
        "the database is up)"
    )


def run_on_store(db: str | None, work: Callable[[SqlSessionStore], Awaitable[T]]) -> T:
    """Open the store on ``--db`` (or ``TURNSTILE_DATABASE_URL``), run ``work`` with it, close
    it; a failure of the database or the engine is a :class:`CommandFailed`."""
    url = resolve_db_url(db, existing=True)
    return _run(_with_store(url, work), url)


def open_app(app_spec: str, db: str | None) -> tuple[Engine, str]:
    """The app ``--app`` names, its agents' stores on ``--db``: the settings with that URL
    are handed down before the import (as ``worker`` does), and an app keeping turns
    elsewhere is refused."""
    settings = load_settings()
    url = resolve_db_url(db, settings, existing=True)
    hand_down(settings, url, None)
    app = load_app(app_spec)
    check_same_database(app, url)
    return app, url


def run_on_app(app: Engine, url: str, work: Callable[[SqlSessionStore], Awaitable[T]]) -> T:
    """Run ``work`` with a store on ``url`` beside the app's agents (read there, write
    through the agents), then close every store."""
    return _run(_with_store(url, work, app), url)


async def _with_store(
    url: str, work: Callable[[SqlSessionStore], Awaitable[T]], app: Engine | None = None
) -> T:
    """Run ``work`` with a one-connection store on ``url``, then close it and, when given,
    the stores of ``app``'s agents (each once: agents may share one)."""
    from stores.sql import SqlSessionStore

    store = SqlSessionStore(url, pool_size=1)
    try:
        return await work(store)
    finally:
        await store.close()
        if app is not None:
            closed: set[int] = set()
            for agent in app.agents.values():
                if agent.store is not None and id(agent.store) not in closed:
                    closed.add(id(agent.store))
                    await agent.store.close()


def _run(work: Coroutine[Any, Any, T], url: str) -> T:
    try:
        return asyncio.run(work)
    except CommandFailed:
        raise
    except (AgentError, OSError) as exc:
        raise _explain(exc, url) from exc
    except Exception as exc:
        import sqlalchemy.exc

        if isinstance(exc, sqlalchemy.exc.SQLAlchemyError):
            raise _explain(exc, url) from exc
        raise


def agent_of(app: Engine, name: str, app_spec: str) -> Agent:
    """The app's agent ``name``, which ran the turn at hand."""
    agent = app.agents.get(name)
    if agent is None:
        known = ", ".join(sorted(app.agents)) or "none"
        raise Refused(
            f"the turn belongs to agent '{name}', which {app_spec} does not define (it "
            f"defines: {known}); give the --app that serves it."
        )
    return agent
