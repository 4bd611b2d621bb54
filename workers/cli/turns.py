"""``turnstile turns``: find, inspect, abort, retry and fork turns from the shell.

``ls``, ``show`` and ``timeline`` read the database on ``--db`` alone. ``abort``, ``retry``
and ``fork`` act through the app's agents (``--app module:attr``, as ``worker`` takes it), so
every rule of the engine applies as it does to a chat or an HTTP client: an abort is
``Agent.abort``, a retry the turn ``chat.send()`` with no message creates (it continues from
the last completed round, with the same journal and idempotency keys), a fork
:func:`engine.fork.fork_turn`. New turns are queued for the workers; this command does not
wait for them. The JSON shapes are documented in ``docs/cli.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from engine.errors import AgentError
from engine.status import ACTIVE_STATUSES, FinishReason, TurnStatus
from engine.store import TimelineEntry, ToolCallRecord, TurnInput, TurnRecord
from engine.turns.request import TurnRequest
from stores.operations import PAUSED, TurnDetail, TurnQuery, TurnRow, WaitingApproval
from stores.sql import SqlSessionStore
from workers.cli.operator import (
    SHORT_ID,
    Moment,
    NotFound,
    OperatorGroup,
    agent_of,
    json_option,
    limit_option,
    named_option,
    open_app,
    resolve_id,
    run_on_app,
    run_on_store,
    wide_option,
)
from workers.cli.output import (
    Column,
    ago,
    console,
    emit_json,
    fields,
    in_words,
    iso,
    message_text,
    print_columns,
    print_rows,
    seconds_since,
    short,
    stderr_console,
    table,
)
from workers.cli.params import db_option, option
from workers.cli.startup import Refused

__all__ = ["turns"]

STATUS_CHOICES = [*(s.value for s in TurnStatus), PAUSED]
RETRYABLE = (TurnStatus.FAILED, TurnStatus.ABORTED)
#: Above this many retried turns, the summary lists only the ones skipped.
LISTED_OUTCOMES = 20
#: Messages of the history a folded conversation shows before the turn's own.
FOLDED_HISTORY = 2
#: One turn ``retry`` retried or skipped, as ``--json`` prints it.
Outcome = dict[str, Any]


def _app_option(function: Any) -> Any:
    return option(
        "--app",
        metavar="MODULE:ATTR",
        default=None,
        show_default=False,
        help="the app's Engine (imported from the current directory), whose agents run the turns",
    )(function)


@click.group("turns", cls=OperatorGroup)
def turns() -> None:
    """Find, inspect, abort, retry and fork turns."""


# -- ls ------------------------------------------------------------------------------------


def approval_wire(waiting: WaitingApproval) -> dict[str, Any]:
    """An open approval a turn waits for, as ``--json`` prints it."""
    return {
        "id": f"{waiting.turn_id}:{waiting.ref}",
        "interrupt": waiting.interrupt,
        "ref": waiting.ref,
        "created_at": iso(waiting.created_at),
    }


def row_wire(
    row: TurnRow | TurnRecord, now: datetime, waiting: list[WaitingApproval]
) -> dict[str, Any]:
    """One turn as ``turns ls --json`` prints it (``turns show --json`` adds to it)."""
    return {
        "id": row.id,
        "session_id": row.session_id,
        "agent": row.agent,
        "parent_id": row.parent_id,
        "status": row.status.value,
        "finish_reason": row.finish_reason.value if row.finish_reason else None,
        "input_kind": row.input_kind if isinstance(row, TurnRow) else row.input.kind,
        "attempts": row.attempts,
        "max_attempts": row.max_attempts,
        "error": row.error.model_dump(exclude_none=True) if row.error else None,
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
        "settled_at": iso(row.settled_at),
        "age_seconds": seconds_since(row.created_at, now),
        "waiting_approvals": [approval_wire(w) for w in waiting],
    }


def _status_text(
    status: TurnStatus, finish: FinishReason | None, waiting: list[WaitingApproval]
) -> str:
    """``paused`` for a turn waiting at approvals now, else its status."""
    if status is TurnStatus.COMPLETED and finish is FinishReason.INTERRUPTED and waiting:
        return "paused"
    return status.value


def _summary(row: TurnRow) -> str:
    """What a listed turn is about, its approvals' inputs in the CLI's words."""
    return row.about(in_words)


async def _listed(
    store: SqlSessionStore, query: TurnQuery, *, abbreviate: bool
) -> tuple[list[TurnRow], dict[str, str]]:
    rows = await store.list_turns(query)
    if not abbreviate:
        return rows, {}
    return rows, await store.id_prefixes("turn", [r.id for r in rows], shortest=SHORT_ID)


@turns.command("ls")
@db_option
@option(
    "--status",
    multiple=True,
    type=click.Choice(STATUS_CHOICES, case_sensitive=False),
    help="only turns in this status (repeatable; paused: waiting at approvals now)",
)
@option("--agent", default=None, help="only this agent's turns")
@option("--session", default=None, metavar="ID", help="only this session's turns (or an id prefix)")
@option("--since", type=Moment(), default=None, help="only turns created since: 2h, 7d, or ISO")
@limit_option(50, 10_000)
@wide_option
@json_option
def ls(
    db: str | None,
    status: tuple[str, ...],
    agent: str | None,
    session: str | None,
    since: datetime | None,
    limit: int,
    wide: bool,
    as_json: bool,
) -> int:
    """List turns, newest first: what each is about, and its id (its first characters:
    enough to name it)."""

    async def read(store: SqlSessionStore) -> tuple[list[TurnRow], dict[str, str]]:
        session_id = session
        if session is not None:
            # An unknown session selects nothing, as it always has.
            session_id = await resolve_id(store, "session", session) or session
        query = TurnQuery(
            statuses=tuple(s.lower() for s in status) or None,
            agent=agent,
            session_id=session_id,
            since=since,
            limit=limit,
        )
        return await _listed(store, query, abbreviate=not (wide or as_json))

    rows, short_ids = run_on_store(db, read)
    now = datetime.now(UTC)

    def status_of(row: TurnRow) -> str:
        return _status_text(row.status, row.finish_reason, row.waiting)

    print_columns(
        rows,
        as_json=as_json,
        wide=wide,
        wire=lambda r: row_wire(r, now, r.waiting),
        empty="No turns match.",
        columns=[
            Column("ID", lambda r: short_ids.get(r.id, r.id), is_id=True),
            Column("STATUS", status_of),
            Column("SUMMARY", _summary, folds=True),
            Column("AGENT", lambda r: r.agent),
            Column("AGE", lambda r: ago(r.created_at, now)),
        ],
        wide_columns=[
            Column("ID", lambda r: r.id, is_id=True),
            Column("AGENT", lambda r: r.agent),
            Column("SESSION", lambda r: r.session_id, is_id=True),
            Column("STATUS", status_of),
            Column("FINISH", lambda r: r.finish_reason.value if r.finish_reason else ""),
            Column("KIND", lambda r: r.input_kind),
            Column("ATTEMPTS", lambda r: f"{r.attempts}/{r.max_attempts}"),
            Column("AGE", lambda r: ago(r.created_at, now)),
            Column("WAITING", lambda r: ", ".join(f"{w.interrupt} {w.ref}" for w in r.waiting)),
        ],
    )
    return 0


# -- show ----------------------------------------------------------------------------------


def call_wire(call: ToolCallRecord) -> dict[str, Any]:
    """One journal row as ``--json`` prints it."""
    return {
        "round": call.round,
        "ref": call.ref,
        "name": call.name,
        "status": call.status.value,
        "input": call.input,
        "output": call.output,
        "error": call.error,
        "interrupt": call.interrupt,
        "idempotency_key": call.idempotency_key,
        "resumed": call.resumed,
        "answer": call.answer,
        "decided_by": call.decided_by,
        "decided_at": iso(call.decided_at),
        "started_at": iso(call.started_at),
        "finished_at": iso(call.finished_at),
        "deadline": iso(call.deadline),
        "created_at": iso(call.created_at),
    }


def detail_wire(detail: TurnDetail, now: datetime) -> dict[str, Any]:
    """``turns show --json``."""
    turn = detail.turn
    described = row_wire(turn, now, detail.waiting)
    described.update(
        {
            "input": turn.input.model_dump(mode="json", exclude_defaults=True),
            "history_length": turn.history_length,
            "lease_owner": turn.lease_owner,
            "lease_expires_at": iso(turn.lease_expires_at),
            "run_after": iso(turn.run_after),
            "input_tokens": turn.input_tokens,
            "output_tokens": turn.output_tokens,
            "custom": turn.custom,
            "artifacts": turn.artifacts or [],
            "app_version": turn.app_version,
            "definition_fingerprint": turn.definition_fingerprint,
            "children": detail.children,
        }
    )
    return {
        "turn": described,
        "conversation": [m.to_wire() for m in detail.conversation],
        "rounds": [
            {
                "round": r.round,
                "committed": r.committed,
                "messages": [m.to_wire() for m in r.messages],
            }
            for r in detail.rounds
        ],
        "tool_calls": [call_wire(c) for c in detail.calls],
    }


def _call_result(call: ToolCallRecord, width: int | None = 80) -> str:
    """What a call returned, its error, or the answer it was resumed with (cut to
    ``width``; ``None``: whole)."""
    if call.error is not None:
        return "error: " + short(call.error, width)
    if call.answer is not None:
        return "answer: " + short(call.answer, width)
    return short(call.output, width)


def _print_detail(detail: TurnDetail, now: datetime, *, full: bool, wide: bool) -> None:
    turn = detail.turn
    out = console()
    out.print(
        fields(
            {
                "turn": turn.id,
                "session": turn.session_id,
                "agent": turn.agent,
                "version": f"{turn.app_version} ({turn.definition_fingerprint})"
                if turn.app_version
                else None,
                "status": _status_text(turn.status, turn.finish_reason, detail.waiting)
                + (f" ({turn.finish_reason.value})" if turn.finish_reason else ""),
                "input": turn.input.kind,
                "error": f"{turn.error.status}: {turn.error.message}" if turn.error else None,
                "attempts": f"{turn.attempts} of {turn.max_attempts}",
                "lease": f"{turn.lease_owner} until {iso(turn.lease_expires_at)}"
                if turn.lease_owner
                else None,
                "created": f"{iso(turn.created_at)} ({ago(turn.created_at, now)} ago)",
                "settled": iso(turn.settled_at),
                "parent": turn.parent_id,
                "continued by": ", ".join(detail.children),
                "forked from": f"{turn.input.forked_from} after round {turn.input.fork_round}"
                if turn.input.forked_from
                else None,
                "tokens": f"{turn.input_tokens} in, {turn.output_tokens} out"
                if turn.input_tokens is not None
                else None,
                "waiting for": ", ".join(
                    f"{w.interrupt} ({w.turn_id}:{w.ref})" for w in detail.waiting
                ),
                "custom state": short(turn.custom, 100) if turn.custom is not None else None,
                "artifacts": ", ".join(str(a.get("name") or "(unnamed)") for a in turn.artifacts)
                if turn.artifacts
                else None,
            }
        )
    )
    history = detail.conversation[: turn.history_length]
    shown = history if full else history[-FOLDED_HISTORY:]
    width = None if full else 110
    lines = []
    if len(shown) < len(history):
        lines.append(f"  … {len(history) - len(shown)} earlier messages (--full shows them)")
    lines += [f"  {m.role}: {_cut(message_text(m), width)}" for m in shown]
    lines += [
        f"  [round {r.round}{'' if r.committed else ', open'}] {m.role}: "
        f"{_cut(message_text(m), width)}"
        for r in detail.rounds
        for m in r.messages
    ]
    out.print("\nConversation", style="bold")
    out.print("\n".join(lines) or "  (empty)", markup=False)
    if detail.calls:
        out.print()
        print_rows(
            detail.calls,
            wide=wide,
            title="Tool calls",
            columns=[
                Column("ROUND", lambda c: c.round),
                Column("REF", lambda c: c.ref, is_id=True),
                Column("CALL", lambda c: in_words(c.name, c.input), folds=True),
                Column("STATE", lambda c: c.status.value),
                Column("RESULT", _call_result, folds=True),
                Column("DECIDED BY", lambda c: c.decided_by),
            ],
            wide_columns=[
                Column("ROUND", lambda c: c.round),
                Column("REF", lambda c: c.ref, is_id=True),
                Column("NAME", lambda c: c.name),
                Column("STATE", lambda c: c.status.value),
                Column("IDEMPOTENCY KEY", lambda c: c.idempotency_key, is_id=True),
                Column("INPUT", lambda c: short(c.input, None)),
                Column("RESULT", lambda c: _call_result(c, None)),
                Column("DECIDED BY", lambda c: c.decided_by),
            ],
        )


def _cut(text: str, width: int | None) -> str:
    text = " ".join(text.split())
    if width is None or len(text) <= width:
        return text
    return text[: width - 1] + "…"


@turns.command("show", short_help="One turn: conversation, rounds, tool calls.")
@click.argument("turn_id", metavar="ID")
@db_option
@named_option("--full", "full", is_flag=True, help="the whole conversation, nothing cut")
@wide_option
@json_option
def show(turn_id: str, db: str | None, full: bool, wide: bool, as_json: bool) -> int:
    """Show one turn: status, error, conversation, rounds and tool calls."""

    async def read(store: SqlSessionStore) -> tuple[TurnDetail, list[TimelineEntry]] | None:
        found = await resolve_id(store, "turn", turn_id)
        if found is None:
            return None
        detail = await store.turn_detail(found)
        return None if detail is None else (detail, await store.timeline(found))

    read_back = run_on_store(db, read)
    if read_back is None:
        raise NotFound(f"no turn {turn_id!r}; find one with `turnstile turns ls`.")
    detail, entries = read_back
    now = datetime.now(UTC)
    if as_json:
        emit_json({**detail_wire(detail, now), "timeline": _timeline_wire(entries)})
    else:
        _print_detail(detail, now, full=full, wide=wide)
        console().print()
        _print_timeline("Timeline", entries, wide=wide)
    return 0


# -- timeline ------------------------------------------------------------------------------


@turns.command("timeline", short_help="Everything that happened to a turn.")
@click.argument("turn_id", metavar="ID")
@db_option
@wide_option
@json_option
def timeline(turn_id: str, db: str | None, wide: bool, as_json: bool) -> int:
    """Everything that happened to a turn, in order (the turn_timeline view)."""

    async def read(store: SqlSessionStore) -> tuple[str, list[TimelineEntry]] | None:
        found = await resolve_id(store, "turn", turn_id)
        if found is None:
            return None
        # The store's order: by time, then as appended (docs/schema.md's query).
        return found, await store.timeline(found)

    read_back = run_on_store(db, read)
    if read_back is None:
        raise NotFound(f"no turn {turn_id!r}; find one with `turnstile turns ls`.")
    full_id, entries = read_back
    if as_json:
        emit_json({"items": _timeline_wire(entries)})
        return 0
    _print_timeline(f"Timeline of {full_id}", entries, wide=wide)
    return 0


def _timeline_wire(entries: list[TimelineEntry]) -> list[dict[str, Any]]:
    return [
        {
            "at": iso(e.at),
            "kind": e.kind,
            "attempt": e.attempt,
            "actor": e.actor,
            "detail": e.detail,
        }
        for e in entries
    ]


def _print_timeline(title: str, entries: list[TimelineEntry], *, wide: bool) -> None:
    """A turn's history as a listing: each entry's seconds since the first, kind, attempt,
    worker or principal and words (the words fold); ``wide`` adds each entry's moment."""
    start = entries[0].at if entries else None

    def since(entry: TimelineEntry) -> str:
        return f"{(entry.at - start).total_seconds():.3f}" if start else ""

    def attempt(entry: TimelineEntry) -> str:
        return "" if entry.attempt is None else str(entry.attempt)

    columns = [
        Column[TimelineEntry]("+SECONDS", since),
        Column[TimelineEntry]("KIND", lambda e: e.kind),
        Column[TimelineEntry]("ATTEMPT", attempt),
        Column[TimelineEntry]("ACTOR", lambda e: e.actor, is_id=True),
        Column[TimelineEntry]("DETAIL", lambda e: e.detail, folds=True),
    ]
    wide_columns = [Column[TimelineEntry]("AT", lambda e: iso(e.at), is_id=True), *columns]
    print_rows(entries, wide=wide, title=title, columns=columns, wide_columns=wide_columns)


# -- abort ---------------------------------------------------------------------------------


@turns.command("abort", short_help="Abort running turns.")
@click.argument("turn_ids", metavar="ID...", nargs=-1, required=True)
@_app_option
@db_option
@json_option
def abort(turn_ids: tuple[str, ...], app: str | None, db: str | None, as_json: bool) -> int:
    """Abort running turns (a turn a worker runs stops at its next step)."""
    engine, url = open_app(_require_app(app, "abort"), db)

    async def run(store: SqlSessionStore) -> list[dict[str, Any]]:
        results = []
        found = [(given, await resolve_id(store, "turn", given)) for given in turn_ids]
        for given, turn_id in found:
            turn = await store.get_turn(turn_id) if turn_id is not None else None
            if turn_id is None or turn is None:
                results.append({"turn_id": given, "status": None, "result": "not_found"})
                continue
            agent = agent_of(engine, turn.agent, str(app))
            outcome = await agent.request_abort(turn_id)
            status = outcome.status.value
            result = status if outcome.previous in ACTIVE_STATUSES else "not_running"
            results.append({"turn_id": turn_id, "status": status, "result": result})
        return results

    results = run_on_app(engine, url, run)
    if as_json:
        emit_json({"items": results})
    else:
        explain = {
            "aborting": "aborting: its worker stops it at its next step",
            "aborted": "aborted",
            "not_running": "not running, nothing to abort",
            "not_found": "not found (see `turnstile turns ls`)",
        }
        console().print(
            table(
                None,
                ["ID", "STATUS", "RESULT"],
                ([r["turn_id"], r["status"] or "", explain[r["result"]]] for r in results),
                no_wrap=["ID"],
            )
        )
    refused = [r for r in results if r["result"] in ("not_running", "not_found")]
    return 1 if refused else 0


def _require_app(app: str | None, verb: str) -> str:
    if not app:
        raise Refused(
            f"{verb} runs turns through the app's agents: give --app module:attr (or set "
            "TURNSTILE_APP), as for `turnstile worker`."
        )
    return app


# -- retry ---------------------------------------------------------------------------------


async def _retry_targets(
    store: SqlSessionStore, turn_ids: tuple[str, ...], query: TurnQuery | None
) -> tuple[list[TurnRow | TurnRecord], list[dict[str, Any]]]:
    """The turns to retry and the ones skipped, each with why."""
    if query is not None:
        return list(await store.list_turns(query)), []
    chosen: list[TurnRow | TurnRecord] = []
    skipped: list[dict[str, Any]] = []
    # A prefix and the whole id of one turn name it once; an unknown one is skipped as given.
    resolved = [await resolve_id(store, "turn", given) or given for given in turn_ids]
    for turn_id in dict.fromkeys(resolved):
        turn = await store.get_turn(turn_id)
        if turn is None:
            skipped.append({"turn_id": turn_id, "reason": "not found"})
        elif turn.status not in RETRYABLE:
            skipped.append(
                {"turn_id": turn_id, "reason": f"{turn.status.value}, not failed or aborted"}
            )
        else:
            latest = await store.latest_turn(turn.session_id)
            if latest is not None and latest.id != turn.id:
                skipped.append({"turn_id": turn_id, "reason": f"already continued by {latest.id}"})
            else:
                chosen.append(turn)
    return chosen, skipped


@turns.command("retry", short_help="Retry failed or aborted turns (bulk too).")
@click.argument("turn_ids", metavar="[ID]...", nargs=-1)
@option(
    "--status",
    multiple=True,
    type=click.Choice(["failed", "aborted"], case_sensitive=False),
    help="retry every turn in this status that is its session's latest (repeatable)",
)
@option("--agent", default=None, help="with --status: only this agent's turns")
@option("--since", type=Moment(), default=None, help="with --status: created since 2h, 7d, ISO")
@limit_option(1000, 100_000)
@named_option(
    "--dry-run", "dry_run", is_flag=True, help="list what a retry would continue; change nothing"
)
@_app_option
@db_option
@wide_option
@json_option
def retry(
    turn_ids: tuple[str, ...],
    status: tuple[str, ...],
    agent: str | None,
    since: datetime | None,
    limit: int,
    dry_run: bool,
    app: str | None,
    db: str | None,
    wide: bool,
    as_json: bool,
) -> int:
    """Retry failed or aborted turns, each from its last completed round."""
    statuses = status
    if bool(turn_ids) == bool(statuses):
        raise click.UsageError(
            "give the turn ids to retry, or --status failed/aborted (with --since, --agent) to "
            "select them; not both."
        )
    if turn_ids and (agent or since):
        raise click.UsageError("--agent and --since select turns with --status, not with ids.")
    query = (
        TurnQuery(
            statuses=tuple(s.lower() for s in statuses),
            agent=agent,
            since=since,
            latest_only=True,
            limit=limit,
        )
        if statuses
        else None
    )
    abbreviate = not (wide or as_json)
    if dry_run:

        async def plan(store: SqlSessionStore) -> _Retries:
            chosen, skipped = await _retry_targets(store, turn_ids, query)
            retried = [{"turn_id": t.id, "agent": t.agent, "retry_id": None} for t in chosen]
            return await _outcomes(store, chosen, retried, skipped, abbreviate=abbreviate)

        outcomes = run_on_store(db, plan)
    else:
        engine, url = open_app(_require_app(app, "retry"), db)

        async def run(store: SqlSessionStore) -> _Retries:
            chosen, skipped = await _retry_targets(store, turn_ids, query)
            for turn in chosen:  # an unknown agent is a usage error before anything is queued
                agent_of(engine, turn.agent, str(app))
            retried, skipped = await _retry_all(engine, chosen, skipped, quiet=as_json)
            return await _outcomes(store, chosen, retried, skipped, abbreviate=abbreviate)

        outcomes = run_on_app(engine, url, run)
    _report_retries(outcomes, dry_run=dry_run, wide=wide, as_json=as_json)
    return 1 if outcomes.skipped else 0


@dataclass(frozen=True)
class _Retries:
    """What ``turns retry`` did (or would do), and how to print its turns."""

    retried: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    #: Each chosen turn's id → how it ended (its error, or ``aborted``).
    ended: dict[str, str]
    #: Each retried and retry turn's id → its shortest unique prefix (none when not wanted).
    short_ids: dict[str, str]


async def _outcomes(
    store: SqlSessionStore,
    chosen: list[TurnRow | TurnRecord],
    retried: list[dict[str, Any]],
    skipped: list[dict[str, Any]],
    *,
    abbreviate: bool,
) -> _Retries:
    ids = [r["turn_id"] for r in retried] + [r["retry_id"] for r in retried if r["retry_id"]]
    short_ids = (
        await store.id_prefixes("turn", ids, shortest=SHORT_ID) if abbreviate and ids else {}
    )
    ended = {t.id: t.error.one_line() if t.error else t.status.value for t in chosen}
    return _Retries(retried, skipped, ended, short_ids)


async def _retry_all(
    engine: Any,
    chosen: list[TurnRow | TurnRecord],
    skipped: list[dict[str, Any]],
    *,
    quiet: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Create a retry turn for each of ``chosen``, with a progress bar on stderr."""
    retried: list[dict[str, Any]] = []
    progress = Progress(
        TextColumn("retrying"),
        BarColumn(),
        MofNCompleteColumn(),
        console=stderr_console(),
        disable=quiet,
    )
    if not chosen:
        return retried, skipped
    with progress:
        task = progress.add_task("retry", total=len(chosen))
        for turn in chosen:
            request = TurnRequest(input=TurnInput(kind="retry"), snapshot_id=turn.id)
            try:
                response = await engine.agents[turn.agent].submit(request)
            except AgentError as refused:
                skipped.append({"turn_id": turn.id, "reason": " ".join(str(refused).split())})
            else:
                retried.append(
                    {"turn_id": turn.id, "agent": turn.agent, "retry_id": response.snapshot_id}
                )
            progress.advance(task)
    return retried, skipped


def _report_retries(outcomes: _Retries, *, dry_run: bool, wide: bool, as_json: bool) -> None:
    retried, skipped = outcomes.retried, outcomes.skipped
    if as_json:
        emit_json({"dry_run": dry_run, "retried": retried, "skipped": skipped})
        return
    if retried and (dry_run or len(retried) <= LISTED_OUTCOMES):

        def shown(turn_id: str) -> str:
            return outcomes.short_ids.get(turn_id, turn_id)

        turn = Column[Outcome]("TURN", lambda r: shown(r["turn_id"]), is_id=True)
        retry_turn = Column[Outcome]("RETRY TURN", lambda r: shown(r["retry_id"]), is_id=True)
        ended = Column[Outcome]("ENDED", lambda r: outcomes.ended.get(r["turn_id"]), folds=True)
        agent = Column[Outcome]("AGENT", lambda r: r["agent"])
        columns = [turn, ended, agent] if dry_run else [turn, retry_turn, ended, agent]
        title = "Would retry" if dry_run else "Retried"
        print_rows(retried, wide=wide, title=title, columns=columns, wide_columns=columns)
    if skipped:
        reasons = [
            Column[Outcome]("TURN", lambda s: s["turn_id"], is_id=True),
            Column[Outcome]("WHY", lambda s: s["reason"], folds=True),
        ]
        print_rows(skipped, wide=wide, title="Skipped", columns=reasons, wide_columns=reasons)
    verb = "would retry" if dry_run else "retried"
    summary = f"{verb} {len(retried)} turn{'s' if len(retried) != 1 else ''}"
    summary += f", skipped {len(skipped)}" if skipped else ""
    if not dry_run and retried:
        summary += "; the workers run them (follow with `turnstile turns ls --status pending`)"
    console().print(summary + ".", markup=False)


# -- fork ----------------------------------------------------------------------------------


@turns.command("fork", short_help="Continue a turn in a new session.")
@click.argument("turn_id", metavar="ID")
@named_option(
    "--round",
    "round_",
    type=click.IntRange(0),
    default=None,
    help="the completed round to continue after [default: the last one the model can continue]",
)
@_app_option
@db_option
@json_option
def fork(turn_id: str, round_: int | None, app: str | None, db: str | None, as_json: bool) -> int:
    """Start a new session whose first turn continues a turn after one of its rounds."""
    from engine.fork import fork_turn

    engine, url = open_app(_require_app(app, "fork"), db)

    async def run(store: SqlSessionStore) -> dict[str, Any]:
        found = await resolve_id(store, "turn", turn_id)
        source = await store.get_turn(found) if found is not None else None
        if found is None or source is None:
            raise NotFound(f"no turn {turn_id!r}; find one with `turnstile turns ls`.")
        agent = agent_of(engine, source.agent, str(app))
        response = await fork_turn(agent, found, round=round_)
        created = await store.get_turn(str(response.snapshot_id))
        return {
            "source_turn_id": found,
            "round": created.input.fork_round if created else round_,
            "agent": agent.name,
            "session_id": response.session_id,
            "turn_id": response.snapshot_id,
            "status": response.status.value,
        }

    forked = run_on_app(engine, url, run)
    if as_json:
        emit_json(forked)
    else:
        click.echo(
            f"forked {forked['source_turn_id']} after round {forked['round']}: new session "
            f"{forked['session_id']}, turn {forked['turn_id']} ({forked['status']}; follow it "
            f"with `turnstile turns show {forked['turn_id']}`)"
        )
    return 0
