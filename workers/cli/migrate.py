"""``turnstile migrate``: bring the database schema to the head migration (Alembic); with
``--sql``, print the SQL instead of applying it; ``migrate current`` and ``migrate history``
say where the database and the code stand."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from stores.database import redact
from workers.cli.operator import OperatorCommand, json_option, named_option
from workers.cli.output import console, emit_json, table
from workers.cli.params import db_option, log_options
from workers.cli.startup import (
    CommandFailed,
    Refused,
    ReportingCommand,
    call_store_hook,
    load_settings,
    resolve_db_url,
    store_hook,
)
from workers.logs import configure_logging

__all__ = ["migrate"]


class MigrateGroup(ReportingCommand, click.Group):
    """``migrate`` itself migrates; its subcommands report. A :class:`CommandFailed` of the
    group's own callback is reported as the commands' are."""

    command_class = OperatorCommand


def _db(ctx: click.Context, db: str | None) -> str | None:
    """A subcommand's ``--db``, else the one given before its name (``migrate --db URL
    current``)."""
    parent = ctx.parent.params.get("db") if ctx.parent is not None else None
    return db or parent


@click.group(
    "migrate",
    cls=MigrateGroup,
    invoke_without_command=True,
    short_help="Migrate the schema to head (--sql: print it); current, history.",
)
@db_option
@log_options
@named_option(
    "--sql", "sql", is_flag=True, help="print the SQL the migration would run; apply nothing"
)
@named_option(
    "--from",
    "start",
    default=None,
    metavar="REVISION",
    help="with --sql: the revision the SQL starts from (base: an empty database) [default: "
    "the database's current revision]",
)
@click.pass_context
def migrate(
    ctx: click.Context,
    db: str | None,
    log_level: str,
    log_format: str,
    sql: bool,
    start: str | None,
) -> int | None:
    """Bring the database schema to head (or, with --sql, print the SQL that would)."""
    if ctx.invoked_subcommand is not None:
        return None
    configure_logging(log_level, log_format)
    if start is not None and not sql:
        raise click.UsageError("--from goes with --sql.")
    url = resolve_db_url(db)
    if sql:
        return _print_sql(url, start)
    hook = store_hook("migrate")
    if hook is None:
        raise Refused("this installation has no SQL store to migrate (stores.migrate).")
    try:
        call_store_hook(hook, url)
    except Exception as exc:
        print(f"turnstile migrate: failed on {redact(url)}: {exc}", file=sys.stderr)
        return 1
    print(f"database at head: {redact(url)}")
    return 0


def _print_sql(url: str, start: str | None) -> int:
    from alembic.util import CommandError

    from stores.migrate import current_revision, head_revision, migration_sql

    if start is None:
        try:
            start = current_revision(url) or "base"
        except Exception as exc:
            raise CommandFailed(
                f"cannot read the revision of {redact(url)} ({' '.join(str(exc).split())}); "
                "give --from base (or a revision) to print the SQL without a database."
            ) from exc
    if start == head_revision():
        click.echo(f"{redact(url)} is at head already: no SQL to run.", err=True)
        return 0
    try:
        text = migration_sql(url, None if start == "base" else start)
    except CommandError as exc:
        raise Refused(f"--from {start}: {exc}") from exc
    sys.stdout.write(text)
    return 0


def _report_command(name: str) -> Callable[[Callable[..., int]], click.Command]:
    """A ``migrate`` subcommand that reports (``current``, ``history``): ``--db``, ``--json``
    and the context, for the ``--db`` given before its name."""

    def decorate(function: Callable[..., int]) -> click.Command:
        return migrate.command(name)(db_option(json_option(click.pass_context(function))))

    return decorate


def _read_revision(url: str, advice: str) -> str | None:
    """The database's migration revision; a :class:`CommandFailed` ending in ``advice``
    when it cannot be read."""
    from stores.migrate import current_revision

    try:
        return current_revision(url)
    except Exception as exc:
        raise CommandFailed(
            f"cannot read {redact(url)}: {' '.join(str(exc).split())} ({advice})"
        ) from exc


@_report_command("current")
def current(ctx: click.Context, db: str | None, as_json: bool) -> int:
    """The database's migration revision, and whether it is the code's head."""
    from stores.migrate import head_revision

    revision = _read_revision(resolve_db_url(_db(ctx, db)), "check --db")
    head = head_revision()
    if as_json:
        emit_json({"current": revision, "head": head, "at_head": revision == head})
        return 0
    if revision is None:
        click.echo(f"empty (never migrated); head is {head}: run `turnstile migrate`")
    elif revision == head:
        click.echo(f"{revision} (head)")
    else:
        click.echo(f"{revision}; head is {head}: run `turnstile migrate`")
    return 0


@_report_command("history")
def history(ctx: click.Context, db: str | None, as_json: bool) -> int:
    """The code's migrations, oldest first (with --db: which the database has applied)."""
    from stores.migrate import head_revision, migration_history

    migrations = migration_history()
    settings = load_settings()
    configured = "database_url" in settings.model_fields_set  # TURNSTILE_DATABASE_URL is set
    given = _db(ctx, db) or (settings.database_url if configured else None)
    revision: str | None = None
    if given:
        revision = _read_revision(
            resolve_db_url(given, settings),
            "check --db, or leave it out to list the code's migrations only",
        )
    order = [m.revision for m in migrations]
    applied_through = order.index(revision) if revision in order else -1

    def applied(index: int) -> bool | None:
        return index <= applied_through if given else None

    if as_json:
        emit_json(
            {
                "head": head_revision(),
                "current": revision,
                "items": [
                    {
                        "revision": m.revision,
                        "down_revision": m.down_revision,
                        "description": m.description,
                        "applied": applied(i),
                    }
                    for i, m in enumerate(migrations)
                ],
            }
        )
        return 0
    columns = ["REVISION", "DESCRIPTION"] + (["APPLIED"] if given else [])
    console().print(
        table(
            None,
            columns,
            (
                [m.revision, m.description] + (["yes" if applied(i) else "no"] if given else [])
                for i, m in enumerate(migrations)
            ),
        )
    )
    return 0
