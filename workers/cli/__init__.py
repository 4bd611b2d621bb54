"""The ``turnstile`` command line: ``turnstile serve``, ``turnstile worker``, ``turnstile migrate``,
and the operator commands ``turnstile turns``, ``turnstile approvals``, ``turnstile stats``,
``turnstile ui sessions``.

A Click group with one module per command (``worker.py``, ``serve.py``, ``migrate.py``,
``turns.py``, ``approvals.py``, ``stats.py``); the parameter types and shared options are in
``params.py``, what ``worker`` and ``serve`` check before they serve in ``startup.py``, their
probes and metrics in ``probes.py``, what the operator commands share in ``operator.py`` and
``output.py`` (their exit statuses: ``docs/cli.md``).

Every option also reads ``TURNSTILE_<OPTION>`` (``--db``: ``TURNSTILE_DATABASE_URL``); a flag
wins over its variable, which wins over the default. Without ``--db`` the URL is
``TURNSTILE_DATABASE_URL``, else an SQLite file under ``.turnstile/``. ``turnstile worker`` and
``turnstile serve`` read the settings (``stores.settings``) once, put the resolved URL (and
``worker`` the stores' pool size) in them and install them *before* importing the app, so the
app builds its store from them (``SqlSessionStore()``, ``current_settings()``); the two
variables are exported as well, for an app that reads them itself. They refuse an app whose
agents keep turns in another database, wait up to ``--connect-timeout`` seconds for a database
that cannot be reached yet, refuse one that is not at the head migration, and stop gracefully
on SIGTERM/SIGINT.

Exit statuses: 0 after a clean stop; 1 when the database stayed unreachable (or a migration
failed); 2 for a usage error or a refusal (its message on stderr, no traceback); 130 on Ctrl-C
before the pool's own signal handling is in place.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence

import click

from stores.settings import using_settings
from workers.cli.approvals import approvals
from workers.cli.migrate import migrate
from workers.cli.params import DATABASE_URL_ENV, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DB_URL
from workers.cli.serve import serve
from workers.cli.startup import resolve_db_url
from workers.cli.stats import stats
from workers.cli.turns import turns
from workers.cli.ui import ui
from workers.cli.versions import migrate_turns
from workers.cli.webhooks import webhooks
from workers.cli.worker import worker

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_DB_URL",
    "cli",
    "main",
    "resolve_db_url",
]


def _version() -> str:
    """The installed distribution's version (a source tree that is not installed: unknown)."""
    try:
        return importlib.metadata.version("turnstile")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


@click.group(
    "turnstile",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(
    _version(), "--version", prog_name="turnstile", message="%(prog)s %(version)s"
)
def cli() -> None:
    """Turnstile: durable, approval-gated LLM agents.

    Every option also reads an environment variable (shown in each command's --help); a flag
    given on the command line wins over its variable, which wins over the default.
    """


cli.add_command(migrate)
cli.add_command(worker)
cli.add_command(serve)
turns.add_command(migrate_turns)
cli.add_command(turns)
cli.add_command(approvals)
cli.add_command(stats)
cli.add_command(ui)
cli.add_command(webhooks)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``turnstile`` command line; returns the process exit status. The settings a
    command hands down to its app (``startup.hand_down``) last until it returns."""
    with using_settings(None):
        try:
            result = cli.main(
                args=list(argv) if argv is not None else None,
                prog_name="turnstile",
                standalone_mode=False,
            )
        except click.ClickException as exc:  # a usage error: Click's message, exit status 2
            exc.show()
            return exc.exit_code
        except click.exceptions.Abort:
            return 130
    return result if isinstance(result, int) else 0
