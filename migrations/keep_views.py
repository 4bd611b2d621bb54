"""Changing columns that views read, on PostgreSQL, with the views kept as they are.

PostgreSQL refuses to change the type or collation of a column a view reads. The migrations
that must (0021, 0023) wrap their ``ALTER TABLE`` statements in :func:`around_views`: one
server-side block, so that ``turnstile migrate --sql`` writes it too, which drops the schema's
views (the newest first: a view may read an older one), runs the changes and creates the views
again, in their order, from the definitions the database itself held.

Migrations that ran keep meaning what they meant: change this block only in a way that leaves
its effect on every schema the earlier migrations built unchanged.
"""

from __future__ import annotations

__all__ = ["around_views"]

_BLOCK = """
DO $$
DECLARE
    names text[];
    texts text[];
BEGIN
    SELECT array_agg(c.relname::text ORDER BY c.oid),
           array_agg(rtrim(rtrim(pg_get_viewdef(c.oid)), ';') ORDER BY c.oid)
    INTO names, texts
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = current_schema() AND c.relkind = 'v';
    FOR i IN REVERSE coalesce(array_upper(names, 1), 0)..1 LOOP
        EXECUTE format('DROP VIEW %I', names[i]);
    END LOOP;
{changes}
    FOR i IN 1..coalesce(array_upper(names, 1), 0) LOOP
        EXECUTE format('CREATE VIEW %I AS %s', names[i], texts[i]);
    END LOOP;
END
$$"""


def around_views(*statements: str) -> str:
    """One ``DO`` block running ``statements`` (each a complete SQL statement, without its
    semicolon) between dropping the schema's views and creating them again."""
    changes = "\n".join(f"    {statement.strip()};" for statement in statements)
    return _BLOCK.format(changes=changes)
