"""Schema management: Alembic is the only way the schema is created or changed."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL

from engine.errors import StoreError
from stores.database import Database, normalise_url, redact

__all__ = [
    "Migration",
    "SchemaNotAtHeadError",
    "current_revision",
    "ensure_at_head",
    "head_revision",
    "migrate",
    "migration_history",
    "migration_sql",
]

_MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


class SchemaNotAtHeadError(StoreError):
    """The database is not migrated to the code's schema (run ``turnstile migrate``)."""


def _config(url: str | URL) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    # Alembic's config is interpolated: escape % in passwords.
    rendered = normalise_url(url).render_as_string(hide_password=False).replace("%", "%%")
    config.set_main_option("sqlalchemy.url", rendered)
    return config


def head_revision() -> str | None:
    """The newest migration in the code."""
    return ScriptDirectory.from_config(_config("sqlite://")).get_current_head()


def current_revision(url: str | URL) -> str | None:
    """The revision the database is at (``None`` for an empty database)."""
    database = Database(url)
    try:
        with database.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        database.dispose()


def migrate(url: str | URL, revision: str = "head") -> None:
    """``alembic upgrade <revision>`` against ``url``."""
    command.upgrade(_config(url), revision)


def ensure_at_head(url: str | URL) -> None:
    """Raise :class:`SchemaNotAtHeadError` with instructions unless the schema is current.

    Workers call this before claiming anything; they never run DDL themselves.
    """
    current, head = current_revision(url), head_revision()
    if current != head:
        state = "empty (never migrated)" if current is None else f"at revision {current}"
        raise SchemaNotAtHeadError(
            f"Database {redact(url)} is {state}; this code needs revision {head}. "
            f"Run: turnstile migrate --db '{redact(url)}'"
        )


@dataclass(frozen=True)
class Migration:
    """One migration of the code, as ``alembic history`` lists it."""

    revision: str
    down_revision: str | None
    description: str


def migration_history() -> list[Migration]:
    """The code's migrations, oldest first."""
    scripts = ScriptDirectory.from_config(_config("sqlite://"))
    found = [
        Migration(
            revision=script.revision,
            down_revision=script.down_revision if isinstance(script.down_revision, str) else None,
            description=" ".join((script.doc or "").split()),
        )
        for script in scripts.walk_revisions()
    ]
    return list(reversed(found))


def migration_sql(url: str | URL, start: str | None, revision: str = "head") -> str:
    """The SQL ``migrate`` would run on ``url``'s kind of database to go from revision
    ``start`` (``None``: an empty database) to ``revision``, without connecting to it
    (Alembic's offline mode)."""
    buffer = io.StringIO()
    config = _config(url)
    config.output_buffer = buffer
    command.upgrade(config, f"{start}:{revision}" if start else revision, sql=True)
    return buffer.getvalue()
