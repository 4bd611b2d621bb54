"""``turnstile turns migrate --from V1 --to V2``: move the turns a version still owes work
to (paused at interrupts, or queued) onto the app's current version.

The app (``--app``) must be the one of ``--to``: its agents' definitions are what the moved
turns are pinned to, and what each turn's recorded definition is compared with. The move is
the operator's explicit choice that the differences are acceptable (a resume of a moved turn
is no longer refused); ``--dry-run`` prints what would move and the differences, changing
nothing. Each move is recorded on the turn's timeline.
"""

from __future__ import annotations

from typing import Any

import click

from engine.engine import Engine
from engine.state.versioning import diff_definitions
from engine.status import TurnStatus
from engine.store import ToolCallStatus, TurnRecord
from stores.sql import SqlSessionStore
from stores.turn_versions import VersionMove
from workers.cli.operator import (
    OperatorCommand,
    json_option,
    limit_option,
    named_option,
    open_app,
    run_on_app,
)
from workers.cli.output import console, emit_json, table
from workers.cli.params import db_option, option
from workers.cli.startup import Refused

__all__ = ["migrate_turns"]


def _moves(engine: Engine, to_version: str, app: str) -> dict[str, VersionMove]:
    """Where each of the app's agents pins moved turns; refuses an app of another version."""
    moves: dict[str, VersionMove] = {}
    for name, agent in engine.agents.items():
        if agent.version == to_version:
            moves[name] = VersionMove(
                to_version=to_version, fingerprint=agent.fingerprint, definition=agent.definition
            )
    if not moves:
        known = ", ".join(engine.versions()) or "none"
        raise Refused(
            f"{app} is not version {to_version!r} (its agents pin turns to: {known}); run "
            "this with the --app of the version the turns move to."
        )
    return moves


async def _plan(
    store: SqlSessionStore,
    engine: Engine,
    waiting: list[TurnRecord],
    moves: dict[str, VersionMove],
) -> list[dict[str, Any]]:
    """One entry per waiting turn: what it is, what changed, and whether it can move."""
    planned: list[dict[str, Any]] = []
    # Read once per fingerprint: the waiting turns of a version share a few definitions.
    recorded: dict[str, dict[str, Any] | None] = {}
    for turn in waiting:
        move = moves.get(turn.agent)
        entry: dict[str, Any] = {
            "turn_id": turn.id,
            "session_id": turn.session_id,
            "agent": turn.agent,
            "state": "queued" if turn.status is TurnStatus.PENDING else "paused",
            "moves": move is not None,
            "changes": [],
            "unknown_interrupts": [],
        }
        if move is None:
            entry["reason"] = "the app has no agent of this name at the target version"
        else:
            fingerprint = turn.definition_fingerprint
            if fingerprint is not None and fingerprint not in recorded:
                recorded[fingerprint] = await store.read_definition(fingerprint)
            before = recorded.get(fingerprint) if fingerprint is not None else None
            changes = diff_definitions(before, dict(move.definition))
            entry["changes"] = [c.model_dump(mode="json") for c in changes]
            entry["change_lines"] = [c.line() for c in changes]
            if turn.status is TurnStatus.COMPLETED:
                tools = engine.agents[turn.agent].tools
                entry["unknown_interrupts"] = sorted(
                    {
                        call.name
                        for call in await store.list_calls(turn.id)
                        if call.status is ToolCallStatus.INTERRUPTED and call.name not in tools
                    }
                )
        planned.append(entry)
    return planned


@click.command(
    "migrate",
    cls=OperatorCommand,
    short_help="Move paused and queued turns to another version.",
)
@named_option("--from", "from_version", required=True, help="the version the turns are pinned to")
@named_option("--to", "to_version", required=True, help="the version to pin them to (the app's)")
@option("--agent", default=None, help="only this agent's turns")
@limit_option(10_000, 1_000_000)
@named_option(
    "--dry-run", "dry_run", is_flag=True, help="print what would move and the diff; change nothing"
)
@option(
    "--app",
    metavar="MODULE:ATTR",
    default=None,
    show_default=False,
    help="the app's Engine at the --to version (imported from the current directory)",
)
@db_option
@json_option
def migrate_turns(
    from_version: str,
    to_version: str,
    agent: str | None,
    limit: int,
    dry_run: bool,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> int:
    """Move the paused and queued turns of version FROM to version TO (the app's)."""
    if not app:
        raise Refused(
            "migrate pins turns to the app's definitions: give --app module:attr of the --to "
            "version (or set TURNSTILE_APP)."
        )
    if from_version == to_version:
        raise click.UsageError("--from and --to name the same version.")
    engine, url = open_app(app, db)
    moves = _moves(engine, to_version, app)
    if agent is not None:
        moves = {name: move for name, move in moves.items() if name == agent}

    async def run(store: SqlSessionStore) -> dict[str, Any]:
        waiting = await store.list_version_waiting(
            from_version, agents=[agent] if agent else None, limit=limit
        )
        planned = await _plan(store, engine, waiting, moves)
        moved: list[str] = []
        if not dry_run:
            movable = [t for t in waiting if t.agent in moves]
            note = f"moved from version {from_version} to {to_version} by turnstile turns migrate"
            moved = await store.move_version(
                movable, from_version=from_version, moves=moves, note=note
            )
        for entry in planned:
            entry["moved"] = entry["turn_id"] in moved
        return {
            "from": from_version,
            "to": to_version,
            "dry_run": dry_run,
            "turns": planned,
            "moved": len(moved),
        }

    result = run_on_app(engine, url, run)
    if as_json:
        emit_json(result)
    else:
        _print(result)
    skipped = [t for t in result["turns"] if not t["moves"]]
    return 1 if skipped else 0


def _print(result: dict[str, Any]) -> None:
    out = console()
    entries = result["turns"]
    if not entries:
        out.print(f"no paused or queued turns of version {result['from']}.", markup=False)
        return
    rows = []
    for entry in entries:
        changes = "; ".join(entry.get("change_lines", [])) or (
            entry.get("reason") or "no differences"
        )
        if entry["unknown_interrupts"]:
            changes += f" (paused at {', '.join(entry['unknown_interrupts'])}: not in the app)"
        rows.append([entry["turn_id"], entry["agent"], entry["state"], changes])
    out.print(table(None, ["ID", "AGENT", "STATE", "CHANGES"], rows, no_wrap=["ID"]))
    verb = "would move" if result["dry_run"] else "moved"
    count = sum(1 for e in entries if e["moves"]) if result["dry_run"] else int(result["moved"])
    out.print(
        f"{verb} {count} of {len(entries)} turns from {result['from']} to {result['to']}.",
        markup=False,
    )
