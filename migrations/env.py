"""Alembic environment: the URL comes from the -x db=URL argument, the config's
``sqlalchemy.url`` (set by ``stores.migrate``), or TURNSTILE_DATABASE_URL."""

from __future__ import annotations

from alembic import context

from stores.database import Database, default_url
from stores.schema import metadata

config = context.config


def _url() -> str:
    return (
        context.get_x_argument(as_dictionary=True).get("db")
        or config.get_main_option("sqlalchemy.url")
        or default_url()
    )


def run_migrations_offline() -> None:
    """Emit SQL without a connection (``alembic upgrade head --sql``)."""
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate through a real connection (one transaction; PostgreSQL DDL is transactional)."""
    database = Database(_url())
    try:
        with database.engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=metadata,
                render_as_batch=connection.dialect.name == "sqlite",
            )
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
    finally:
        database.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
