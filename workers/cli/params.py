"""The ``turnstile`` command's parameter types and the options its commands share.

Every option reads an environment variable too: ``--concurrency`` reads
``TURNSTILE_CONCURRENCY``, ``--log-format`` ``TURNSTILE_LOG_FORMAT`` (the flag's name, upper
case, ``-`` as ``_``), except ``--db``, which reads ``TURNSTILE_DATABASE_URL`` like the stores.
A flag on the command line wins over its variable, which wins over the default (Click's
``envvar``: see :func:`option`). A value that does not parse, from either, is a usage error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from stores.settings import DEFAULT_DATABASE_URL
from workers.logs import LOG_FORMATS, LOG_LEVELS

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_DB_URL",
    "ENV_PREFIX",
    "Port",
    "Seconds",
    "WholeNumber",
    "app_option",
    "connect_timeout_option",
    "db_option",
    "dev_option",
    "env_name",
    "log_options",
    "option",
    "pool_size_option",
    "retry_options",
]

#: The prefix of every option's environment variable.
ENV_PREFIX = "TURNSTILE_"
#: The environment variable holding the database URL (``--db``).
DATABASE_URL_ENV = "TURNSTILE_DATABASE_URL"
#: The embedded default: an SQLite file in ``.turnstile/`` under the current directory.
DEFAULT_DB_URL = DEFAULT_DATABASE_URL
#: How long a starting process waits, by default, for a database it cannot reach.
DEFAULT_CONNECT_TIMEOUT = 60.0

F = TypeVar("F", bound=Callable[..., Any])


def env_name(flag: str) -> str:
    """The environment variable of ``flag``: ``--db`` → ``TURNSTILE_DATABASE_URL``,
    ``--log-format`` → ``TURNSTILE_LOG_FORMAT``."""
    if flag == "--db":
        return DATABASE_URL_ENV
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def option(flag: str, **settings: Any) -> Callable[[F], F]:
    """``click.option(flag)`` that also reads :func:`env_name` of ``flag`` and shows it in
    ``--help`` (with the default, when there is one)."""
    settings.setdefault("show_default", settings.get("default") is not None)
    return click.option(flag, envvar=env_name(flag), show_envvar=True, **settings)


class Seconds(click.ParamType[float, Any]):
    """A number of seconds (or another ``unit``): ``>= 0``; with ``positive``, ``> 0`` and
    finite, as for a timeout that would otherwise refuse everything or never fire."""

    name = "seconds"

    def __init__(self, *, positive: bool = False, unit: str = "seconds") -> None:
        self.positive = positive
        self.unit = unit
        self.name = unit

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value))
            except ValueError:
                number = -1.0
        if not number >= 0:  # also refuses nan
            self.fail(f"expected a number of {self.unit} >= 0, not {value!r}", param, ctx)
        if self.positive and (number == 0 or math.isinf(number)):
            self.fail(f"expected a finite number of {self.unit} > 0, not {value!r}", param, ctx)
        return number


class WholeNumber(click.ParamType[int, Any]):
    """An integer of at least ``minimum``."""

    name = "integer"

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(str(value))
            except ValueError:
                number = self.minimum - 1
        if number < self.minimum:
            self.fail(f"expected a whole number >= {self.minimum}, not {value!r}", param, ctx)
        return number


class Port(click.ParamType[int, Any]):
    """A TCP port, 0 to 65535 (0: any free port)."""

    name = "port"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            number = int(str(value))
        except ValueError:
            number = -1
        if not 0 <= number <= 65535:
            self.fail(f"expected a port number 0-65535, not {value!r}", param, ctx)
        return number


def app_option(function: F) -> F:
    """``--app module:attribute``: the app's :class:`engine.Engine`."""
    return option(
        "--app",
        required=True,
        metavar="MODULE:ATTR",
        help="the app's Engine, imported from the current directory",
    )(function)


def db_option(function: F) -> F:
    """``--db URL`` (``TURNSTILE_DATABASE_URL``); resolved by ``startup.resolve_db_url``."""
    return option(
        "--db",
        metavar="URL",
        help=f"database URL: postgresql://… (or postgres://…) or sqlite:///path "
        f"[default: {DEFAULT_DB_URL}]",
    )(function)


def connect_timeout_option(function: F) -> F:
    """``--connect-timeout S``: how long a starting process waits for the database."""
    return option(
        "--connect-timeout",
        type=Seconds(),
        default=DEFAULT_CONNECT_TIMEOUT,
        help="seconds to wait at start for a database that cannot be reached yet (0: try once)",
    )(function)


def log_options(function: F) -> F:
    """``--log-level`` and ``--log-format``."""
    function = option(
        "--log-format",
        type=click.Choice(LOG_FORMATS, case_sensitive=False),
        default="text",
        help="text: one line for people; json: one JSON object a line",
    )(function)
    return option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="INFO",
        help="how much to log (APScheduler's and Alembic's routine lines only at DEBUG)",
    )(function)


def dev_option(function: F) -> F:
    """``--dev``: serve client-managed agents whose signing key is an example or missing,
    and resume turns paused before a prompt edit (lenient pinning)."""
    return option(
        "--dev",
        is_flag=True,
        default=False,
        show_default=False,
        help="development only: accept client-managed agents signed with an example key or "
        "a per-process random one, and resume turns paused before an edit that kept every "
        "tool and schema (a prompt, a model), with a warning",
    )(function)


def retry_options(function: F) -> F:
    """``--max-attempts`` and ``--retry-backoff``: the retry policy of agents without one."""
    function = option(
        "--retry-backoff",
        type=Seconds(),
        default=None,
        help="seconds before the first retry (then doubling, capped at 30 s), for agents "
        "defined without a retry policy [default: 0.25]",
    )(function)
    return option(
        "--max-attempts",
        type=WholeNumber(1),
        default=None,
        help="attempts of a turn after transient failures, for agents defined without "
        "max_attempts or retry [default: 3]",
    )(function)


def pool_size_option(default_help: str) -> Callable[[F], F]:
    """``--db-pool-size N``: the app store's ``pool_size``, when the app gives none."""
    return option(
        "--db-pool-size",
        type=WholeNumber(1),
        default=None,
        help=f"pool_size of the app's SqlSessionStore when the app passes none [default: "
        f"{default_help}]",
    )
