"""``turnstile approvals``: list, inspect and decide open approvals from the shell.

``ls`` and ``show`` read the database on ``--db`` alone. ``approve``, ``deny`` and
``restart`` decide through :func:`engine.inbox.decide` with the app's agent (``--app``), the
call behind ``POST /inbox/{id}/decision``: the answer is checked against the interrupt's
output schema, recorded once (a second decision is refused, exit 1), with ``--by`` as
``decided_by``; the last decision of a paused turn queues its resume for the workers.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from engine import Engine
from engine.errors import ApprovalNotPendingError, InvalidArgumentError
from engine.inbox import Decision, DecisionOutcome, approval_id, decide, find_approval
from engine.inbox import parse_approval_id as _parse_id
from engine.parts import Message
from engine.store import ApprovalQuery, PendingApproval, ToolCallRecord, ToolCallStatus
from stores.sql import SqlSessionStore
from workers.cli.operator import (
    Age,
    Declined,
    JsonText,
    NotFound,
    OperatorGroup,
    agent_of,
    json_option,
    limit_option,
    named_option,
    open_app,
    read_json_file,
    run_on_app,
    run_on_store,
)
from workers.cli.output import (
    ago,
    console,
    emit_json,
    fields,
    iso,
    message_text,
    seconds_since,
    short,
    table,
)
from workers.cli.params import db_option, option
from workers.cli.startup import Refused

__all__ = ["approvals", "yes_no_answer"]

#: Messages before the pause that ``show`` prints unless ``--full``.
FOLDED_CONVERSATION = 6


@click.group("approvals", cls=OperatorGroup)
def approvals() -> None:
    """List, inspect and decide open approvals."""


def approval_wire(approval: PendingApproval, now: datetime) -> dict[str, Any]:
    """One approval as ``approvals ls --json`` prints it (the inbox's fields, snake_case)."""
    return {
        "id": approval_id(approval.turn_id, approval.ref),
        "turn_id": approval.turn_id,
        "session_id": approval.session_id,
        "agent": approval.agent,
        "app_version": approval.app_version,
        "owner": approval.owner,
        "interrupt": approval.interrupt,
        "ref": approval.ref,
        "round": approval.round,
        "input": approval.input,
        "metadata": approval.metadata,
        "deadline": iso(approval.deadline),
        "created_at": iso(approval.created_at),
        "age_seconds": seconds_since(approval.created_at, now),
    }


def _parse(value: str) -> tuple[str, str]:
    try:
        return _parse_id(value)
    except Exception:
        raise NotFound(
            f"{value!r} is not an approval id (TURN:REF); list them with `turnstile approvals ls`."
        ) from None


# -- ls ------------------------------------------------------------------------------------


@approvals.command("ls")
@db_option
@option("--agent", multiple=True, help="only this agent's approvals (repeatable)")
@option("--interrupt", default=None, help="only approvals of this interrupt")
@option("--older-than", type=Age(), default=None, help="only approvals at least this old: 1h, 1d")
@limit_option(50, 1000)
@json_option
def ls(
    db: str | None,
    agent: tuple[str, ...],
    interrupt: str | None,
    older_than: float | None,
    limit: int,
    as_json: bool,
) -> int:
    """List open approvals, oldest first."""
    now = datetime.now(UTC)
    query = ApprovalQuery(
        agents=agent or None,
        interrupt=interrupt,
        created_before=now - timedelta(seconds=older_than) if older_than else None,
        limit=limit,
    )
    rows = run_on_store(db, lambda store: store.list_approvals(query))
    if as_json:
        emit_json({"items": [approval_wire(a, now) for a in rows]})
        return 0
    if not rows:
        click.echo("No open approvals match.", err=True)
        return 0
    console().print(
        table(
            None,
            ["ID", "AGENT", "VERSION", "INTERRUPT", "INPUT", "AGE", "DEADLINE", "SESSION"],
            (
                [
                    approval_id(a.turn_id, a.ref),
                    a.agent,
                    a.app_version or "",
                    a.interrupt,
                    short(a.input, 50),
                    ago(a.created_at, now),
                    iso(a.deadline) or "",
                    a.session_id,
                ]
                for a in rows
            ),
            no_wrap=["ID", "SESSION"],
        )
    )
    return 0


# -- show ----------------------------------------------------------------------------------


def _state(call: ToolCallRecord, is_open: bool) -> str:
    if is_open:
        return "open"
    if call.status is ToolCallStatus.INTERRUPTED and call.decided_at is not None:
        return "decided"
    if call.status is ToolCallStatus.INTERRUPTED:
        return "closed"  # its turn is no longer its session's latest paused turn
    return call.status.value


async def _read_approval(
    store: SqlSessionStore, value: str
) -> tuple[PendingApproval, bool, ToolCallRecord, list[ToolCallRecord], list[Message]]:
    turn_id, ref = _parse(value)
    found = await find_approval(store, turn_id, ref)
    if found is None:
        raise NotFound(f"no approval {value!r}; list open ones with `turnstile approvals ls`.")
    approval, is_open = found
    calls = [c for c in await store.list_calls(turn_id) if c.round == approval.round]
    call = next(c for c in calls if c.ref == ref)
    conversation = await store.load_conversation(turn_id)
    return approval, is_open, call, [c for c in calls if c.ref != ref], conversation


@approvals.command("show", short_help="One approval: input, paused call, conversation.")
@click.argument("approval", metavar="ID")
@db_option
@named_option("--full", "full", is_flag=True, help="the whole conversation before the pause")
@json_option
def show(approval: str, db: str | None, full: bool, as_json: bool) -> int:
    """Show one approval: its input, the call it pauses, and the conversation before it."""
    entry, is_open, call, siblings, conversation = run_on_store(
        db, lambda store: _read_approval(store, approval)
    )
    now = datetime.now(UTC)
    before = conversation[:-1]  # the last message is the paused model message
    if as_json:
        described = approval_wire(entry, now)
        described.update(
            {
                "open": is_open,
                "state": _state(call, is_open),
                "answer": call.answer,
                "decided_by": call.decided_by,
                "decided_at": iso(call.decided_at),
            }
        )
        emit_json(
            {
                "approval": described,
                "call": {"name": call.name, "ref": call.ref, "input": call.input},
                "siblings": [
                    {
                        "name": c.name,
                        "ref": c.ref,
                        "status": c.status.value,
                        "input": c.input,
                        "output": c.output,
                        "error": c.error,
                    }
                    for c in siblings
                ],
                "conversation": [m.to_wire() for m in before],
            }
        )
        return 0
    out = console()
    out.print(
        fields(
            {
                "approval": approval_id(entry.turn_id, entry.ref),
                "state": _state(call, is_open),
                "agent": entry.agent,
                "session": entry.session_id,
                "owner": entry.owner,
                "asked": f"{iso(entry.created_at)} ({ago(entry.created_at, now)} ago)",
                "deadline": iso(entry.deadline),
                "decided": f"by {call.decided_by or 'an anonymous approver'} at "
                f"{iso(call.decided_at)}: {json.dumps(call.answer)}"
                if call.decided_at
                else None,
            }
        )
    )
    out.print("\nPaused call", style="bold")
    out.print(f"  {call.name}#{call.ref}", markup=False)
    out.print(json.dumps(call.input, indent=2, ensure_ascii=False), markup=False)
    if siblings:
        out.print()
        out.print(
            table(
                "Other calls of the same model message",
                ["REF", "NAME", "STATE", "ARGUMENTS", "RESULT"],
                (
                    [c.ref, c.name, c.status.value, short(c.input, 60), short(c.output or c.error)]
                    for c in siblings
                ),
            )
        )
    shown = before if full else before[-FOLDED_CONVERSATION:]
    out.print("\nConversation before it", style="bold")
    if len(shown) < len(before):
        out.print(f"  … {len(before) - len(shown)} earlier messages (--full shows them)")
    for message in shown:
        out.print(f"  {message.role}: {message_text(message)}", markup=False)
    return 0


# -- deciding ------------------------------------------------------------------------------


def yes_no_answer(schema: dict[str, Any] | None, approved: bool) -> Any:
    """The answer ``approve`` (``True``) or ``deny`` (``False``) gives without ``--answer``:
    the boolean itself for an interrupt answering a boolean (or declaring no schema),
    ``{"approved": …}`` for one answering an object with a boolean ``approved``; ``None``
    when the schema asks for more than a yes or a no."""
    if not schema:
        return approved
    if schema.get("type") == "boolean":
        return approved
    properties = schema.get("properties")
    if schema.get("type") == "object" and isinstance(properties, dict):
        flag = properties.get("approved")
        required = set(schema.get("required") or []) - {"approved"}
        if isinstance(flag, dict) and flag.get("type") == "boolean" and not required:
            return {"approved": approved}
    return None


def _contradicts(answer: Any, approved: bool) -> bool:
    """Whether an explicit answer says the opposite of the verb that gives it."""
    flag = answer.get("approved") if isinstance(answer, dict) else answer
    return isinstance(flag, bool) and flag is not approved


def _answer_value(answer: Any, answer_file: str | None) -> Any:
    if answer is not None and answer_file is not None:
        raise click.UsageError("give --answer or --answer-file, not both.")
    if answer_file is not None:
        return read_json_file(answer_file)
    return answer


def _decision(verb: str, answer: Any, approval: PendingApproval, app: Engine) -> Decision:
    """The decision ``verb`` makes with ``answer`` (``None``: none was given)."""
    if verb == "restart":
        return Decision(restart=True, resumed=answer)
    approved = verb == "approve"
    if answer is None:
        tool = app.agents[approval.agent].tools.get(approval.interrupt)
        schema = tool.output.json_schema() if tool is not None else None
        answer = yes_no_answer(schema, approved)
        if answer is None:
            raise Refused(
                f"'{approval.interrupt}' answers more than yes or no: give --answer JSON "
                f"matching its output schema {json.dumps(schema)}."
            )
    elif _contradicts(answer, approved):
        other = "deny" if approved else "approve"
        raise Refused(
            f"{verb} with the answer {json.dumps(answer)} contradicts itself; use "
            f"`turnstile approvals {other}`."
        )
    return Decision(respond=answer)


def _decide_command(verb: str, help_text: str) -> click.Command:
    @approvals.command(verb, help=help_text, short_help=help_text.split(" (")[0].rstrip(".") + ".")
    @click.argument("approval", metavar="ID")
    @named_option(
        "--answer",
        "answer",
        type=JsonText(),
        default=None,
        help="the answer as JSON (restart: the metadata the tool sees as ctx.resumed)",
    )
    @named_option(
        "--answer-file",
        "answer_file",
        default=None,
        metavar="FILE",
        help="read the answer's JSON from FILE (-: standard input)",
    )
    @option("--by", required=True, metavar="NAME", help="who decides (recorded as decided_by)")
    @option("--app", required=True, metavar="MODULE:ATTR", help="the app's Engine")
    @db_option
    @json_option
    def command(
        approval: str,
        answer: Any,
        answer_file: str | None,
        by: str,
        app: str,
        db: str | None,
        as_json: bool,
    ) -> int:
        given = _answer_value(answer, answer_file)
        if not by.strip():
            raise click.BadParameter("must name who decides", param_hint="--by")
        turn_id, ref = _parse(approval)
        engine, url = open_app(app, db)

        async def run(store: SqlSessionStore) -> DecisionOutcome:
            found = await find_approval(store, turn_id, ref)
            if found is None:
                raise NotFound(
                    f"no approval {approval!r}; list open ones with `turnstile approvals ls`."
                )
            entry, is_open = found
            agent = agent_of(engine, entry.agent, app)
            if not is_open:
                raise Declined(
                    f"approval {approval} is no longer pending: it was decided or answered "
                    f"already (see `turnstile approvals show {approval}`)."
                )
            decision = _decision(verb, given, entry, engine)
            try:
                return await decide(agent, entry, decision, decided_by=by)
            except ApprovalNotPendingError as exc:
                raise Declined(f"{exc} (see `turnstile approvals show {approval}`)") from exc
            except InvalidArgumentError as exc:
                raise Refused(str(exc)) from exc

        outcome = run_on_app(engine, url, run)
        _report(approval, outcome, as_json=as_json)
        return 0

    return command


def _report(approval: str, outcome: DecisionOutcome, *, as_json: bool) -> None:
    decided = outcome.decided
    if as_json:
        emit_json(
            {
                "id": approval,
                "decided": outcome.is_decided,
                "answer": decided.answer,
                "decided_by": decided.decided_by,
                "decided_at": iso(decided.decided_at),
                "resume_turn_id": outcome.resume_snapshot_id,
                "waiting_for": outcome.waiting_for,
                "votes": [
                    {"voter": v.voter, "approves": v.approves, "voted_at": iso(v.voted_at)}
                    for v in outcome.votes
                ],
            }
        )
        return
    if not outcome.is_decided:
        approving = sum(v.approves for v in outcome.votes)
        click.echo(
            f"{approval}: vote recorded ({approving} approving so far); the approval stays "
            "open until its policy's quorum is reached"
        )
        return
    line = f"{approval}: {json.dumps(decided.answer)} recorded, decided by {decided.decided_by}"
    if outcome.resume_snapshot_id:
        line += (
            f"; resume queued as turn {outcome.resume_snapshot_id} (follow it with "
            f"`turnstile turns show {outcome.resume_snapshot_id}`)"
        )
    elif outcome.waiting_for:
        line += f"; the turn still waits for {', '.join(outcome.waiting_for)}"
    click.echo(line)


approve = _decide_command(
    "approve",
    'Approve an open approval (without --answer: true, or {"approved": true}).',
)
deny = _decide_command(
    "deny",
    'Deny an open approval (without --answer: false, or {"approved": false}).',
)
restart = _decide_command(
    "restart",
    "Decide an open approval by restarting its call (the interrupt asks again; a tool "
    "that paused itself runs again).",
)
