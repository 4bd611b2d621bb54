"""``turnstile ui sessions``: list and revoke the inbox UI's signed-in browsers.

Reads and writes the ``ui_sessions`` table on ``--db`` alone (no app needed). A revoked
session ends at once, in every server process sharing the database: the browser's next
request is sent to the login page (docs/inbox.md, "Browser sessions").
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import click

from engine.remote.ui.browser_sessions import BrowserSessionRecord
from stores.sql import SqlSessionStore
from stores.ui_sessions import SqlBrowserSessions
from workers.cli.operator import (
    Age,
    NotFound,
    OperatorGroup,
    json_option,
    resolve_id,
    run_on_store,
)
from workers.cli.output import ago, emit_json, iso, print_listing
from workers.cli.params import db_option, option

__all__ = ["ui"]


@click.group("ui")
def ui() -> None:
    """The inbox web app (/ui): its browser sessions."""


@ui.group("sessions", cls=OperatorGroup)
def sessions() -> None:
    """List and revoke signed-in browsers."""


def session_wire(session: BrowserSessionRecord, now: datetime) -> dict[str, Any]:
    """One session as ``ui sessions ls --json`` prints it."""
    state = "live"
    if session.revoked_at is not None:
        state = "revoked"
    elif session.expires_at <= now:
        state = "expired"
    return {
        "id": session.id,
        "principal": session.principal,
        "roles": list(session.roles),
        "state": state,
        "created_at": iso(session.created_at),
        "last_seen_at": iso(session.last_seen_at),
        "expires_at": iso(session.expires_at),
        "revoked_at": iso(session.revoked_at),
        "user_agent": session.user_agent,
        "client_address": session.client_address,
    }


@sessions.command("ls")
@db_option
@option("--principal", default=None, help="only this principal's sessions")
@option(
    "--ended-within",
    type=Age(),
    default=None,
    help="also sessions revoked or expired this recently: 1h, 1d",
)
@json_option
def ls(db: str | None, principal: str | None, ended_within: float | None, as_json: bool) -> int:
    """List sessions not revoked or expired, newest first (idle ones included)."""
    now = datetime.now(UTC)
    since = now - timedelta(seconds=ended_within) if ended_within else None
    rows = run_on_store(
        db,
        lambda store: SqlBrowserSessions(store.db).list_browser_sessions(
            principal=principal, include_ended_after=since
        ),
    )
    print_listing(
        rows,
        as_json=as_json,
        wire=lambda s: session_wire(s, now),
        empty="No browser sessions match.",
        columns=[
            "ID",
            "PRINCIPAL",
            "STATE",
            "SIGNED IN",
            "LAST SEEN",
            "EXPIRES",
            "ADDRESS",
            "BROWSER",
        ],
        cells=lambda s: [
            s.id,
            s.principal,
            session_wire(s, now)["state"],
            ago(s.created_at, now),
            ago(s.last_seen_at, now),
            iso(s.expires_at) or "",
            s.client_address,
            s.user_agent[:40],
        ],
        no_wrap=["ID"],
    )
    return 0


@sessions.command("revoke", short_help="End one session, or all of a principal's.")
@click.argument("session_id", metavar="[ID]", required=False)
@db_option
@option("--principal", default=None, help="revoke every session of this principal")
@json_option
def revoke(session_id: str | None, db: str | None, principal: str | None, as_json: bool) -> int:
    """Revoke the session ID, or with --principal every session of that principal; the
    browsers are signed out on their next request. Exit 1 when nothing was revoked for an
    ID (unknown, or already ended)."""
    if (session_id is None) == (principal is None):
        raise click.UsageError("give a session ID or --principal NAME (not both).")
    now = datetime.now(UTC)

    async def revoke(store: SqlSessionStore) -> list[str]:
        chosen = session_id
        if session_id is not None:
            # A unique prefix names the session; an unknown id revokes nothing (exit 1).
            chosen = await resolve_id(store, "browser session", session_id) or session_id
        return await SqlBrowserSessions(store.db).revoke_browser_sessions(
            now=now, session_id=chosen, principal=principal
        )

    revoked = run_on_store(db, revoke)
    if as_json:
        emit_json({"revoked": revoked})
    elif revoked:
        click.echo(f"Revoked {len(revoked)} session(s): {', '.join(revoked)}")
    else:
        click.echo("No live session to revoke.", err=True)
    if session_id is not None and not revoked:
        raise NotFound(
            f"no live session {session_id!r}; list them with `turnstile ui sessions ls`."
        )
    return 0
