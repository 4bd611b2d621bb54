"""Alembic environment: the URL comes from the -x db=URL argument, the config's
``sqlalchemy.url`` (set by ``stores.migrate``), or TURNSTILE_DATABASE_URL."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy.engine import make_url

from stores.database import Database, default_url
from stores.schema import ONLY_ON, metadata

config = context.config


def _url() -> str:
    return (
        context.get_x_argument(as_dictionary=True).get("db")
        or config.get_main_option("sqlalchemy.url")
        or default_url()
    )


def _on_dialect(dialect: str) -> Any:
    """The comparison's filter: a model object marked as one dialect's alone (``ONLY_ON`` in
    its ``info``) is compared on that dialect's databases only."""

    def include(item: Any, name: str | None, type_: str, reflected: bool, other: Any) -> bool:
        model = other if reflected else item
        only_on = getattr(model, "info", {}).get(ONLY_ON) if model is not None else None
        return only_on is None or only_on == dialect

    return include


def run_migrations_offline() -> None:
    """Emit SQL without a connection (``alembic upgrade head --sql``)."""
    url = _url()
    context.configure(
        url=url,
        target_metadata=metadata,
        literal_binds=True,
        include_object=_on_dialect(make_url(url).get_backend_name()),
    )
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
                include_object=_on_dialect(connection.dialect.name),
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
