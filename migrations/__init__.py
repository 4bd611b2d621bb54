"""Alembic migrations of the SQL session store (the environment lands with the durable store)."""
