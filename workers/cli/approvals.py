"""``turnstile approvals``: list, inspect, assign and decide open approvals from the shell.

``ls`` and ``show`` read the database on ``--db`` alone (``ls --app`` adds the interrupts'
default groups). ``claim``, ``assign`` and ``release`` change who holds an approval through
:mod:`engine.approvals.assignment` as an operator: the approval policy and the assignment's
restriction are not checked (the operator holds the database), the claim guard and "still open" are.
``approve``, ``deny``, ``reject`` and ``restart`` decide through
:func:`engine.approvals.decide.decide` with the app's agent (``--app``), the call behind
``POST /inbox/{id}/decision``: the answer is checked against the interrupt's output schema,
recorded once (a second decision is refused, exit 1), with ``--by`` as ``decided_by``; the
last decision of a paused turn queues its resume for the workers. Like ``worker``, they
refuse an app whose client-managed agents sign with a published key unless ``--dev``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from engine import Agent, Engine
from engine.approval_policy import ApprovalRefusedError
from engine.approvals.assignment import assign, claim, current_assignments, release
from engine.approvals.decide import (
    Decision,
    DecisionOutcome,
    NamedApprover,
    approval_id,
    decide,
    find_approval,
    yes_no_answer,
)
from engine.approvals.wording import word_approval
from engine.conversation.parts import Message
from engine.errors import ApprovalNotPendingError, FailedPreconditionError, InvalidArgumentError
from engine.escalation import EscalationProgress, progress
from engine.rejection import MAX_REASON_LENGTH, Rejection
from engine.store import (
    ApprovalClaimedError,
    ApprovalQuery,
    Assignment,
    PendingApproval,
    ToolCallRecord,
    ToolCallStatus,
)
from stores.sql import SqlSessionStore
from workers.cli.operator import (
    SHORT_ID,
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
    resolve_approval,
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
    seconds_since,
    short,
    table,
)
from workers.cli.params import db_option, dev_option, option
from workers.cli.startup import Refused, allow_prompt_edits, check_keys

__all__ = ["approvals", "assignment_fields", "yes_no_answer"]

T = TypeVar("T")

#: Messages before the pause that ``show`` prints unless ``--full``.
FOLDED_CONVERSATION = 6
#: What ``ls`` shows for an approval with no stored assignment.
NOBODY = Assignment(turn_id="", round=0, ref="")


def _assigned_text(assignment: Assignment | None) -> str | None:
    """``show``'s line about who holds the approval (``None``: nothing stored)."""
    if assignment is None:
        return None
    text = f"{assignment.describe()} (by {assignment.assigned_by or '-'})"
    if assignment.escalated_at is not None:
        text += (
            f"; escalated to {assignment.escalated_to} (step {assignment.escalation_step}) at "
            f"{iso(assignment.escalated_at)} from "
            f"{assignment.escalated_from_assignee or assignment.escalated_from_group or '-'}"
        )
    return text


def _escalation_progress(
    agents: Mapping[str, Agent], entry: PendingApproval, held: Assignment | None, is_open: bool
) -> EscalationProgress | None:
    """Where the approval is in its interrupt's escalation chain (``None``: no ``--app``, or
    the interrupt does not escalate)."""
    agent = agents.get(entry.agent)
    tool = agent.tools.get(entry.interrupt) if agent is not None else None
    chain = getattr(tool, "escalation", None)
    if chain is None:
        return None
    return progress(
        chain,
        held.escalation_step if held is not None else 0,
        created_at=entry.created_at,
        escalated_at=held.escalated_at if held is not None else None,
        is_open=is_open,
    )


def _group_text(assignment: Assignment) -> str:
    if assignment.escalated_at is not None:
        return f"{assignment.group} (escalated from {assignment.escalated_from_group or '-'})"
    return assignment.group or ""


@click.group("approvals", cls=OperatorGroup)
def approvals() -> None:
    """List, inspect and decide open approvals."""


def assignment_fields(assignment: Assignment | None) -> dict[str, Any]:
    """Who holds an approval, as ``--json`` prints it (all ``null``: nothing stored)."""
    held = assignment or Assignment(turn_id="", round=0, ref="")
    return {
        "assignee": held.assignee,
        "group": held.group,
        "assigned_by": held.assigned_by,
        "assigned_at": iso(held.assigned_at),
        "escalated_at": iso(held.escalated_at),
        "escalated_from_assignee": held.escalated_from_assignee,
        "escalated_from_group": held.escalated_from_group,
        "escalated_to": held.escalated_to,
        "reminders": held.reminders,
        "last_reminded_at": iso(held.last_reminded_at),
        "escalation_step": held.escalation_step,
    }


def approval_wire(
    approval: PendingApproval, now: datetime, agents: Mapping[str, Agent]
) -> dict[str, Any]:
    """One approval as ``approvals ls --json`` prints it (the inbox's fields, snake_case),
    worded by ``agents`` (the app's, with ``--app``; else none: the code name and input)."""
    said = word_approval(agents, approval.agent, approval.interrupt, approval.input)
    return {
        "id": approval_id(approval.turn_id, approval.ref),
        "title": said.title,
        "summary": said.summary,
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


def _read(
    db: str | None,
    app: str | None,
    work: Callable[[SqlSessionStore, Engine | None], Awaitable[T]],
) -> tuple[T, Mapping[str, Agent]]:
    """``work`` on the database, beside the app ``--app`` names when given; with the app's
    agents (none without it), which word the approvals."""
    if app is None:
        return run_on_store(db, lambda store: work(store, None)), {}
    engine, url = open_app(app, db)
    return run_on_app(engine, url, lambda store: work(store, engine)), engine.agents


def _asked(approval: PendingApproval, agents: Mapping[str, Agent]) -> str:
    """What ``approval`` asks, uncut: the app's declared summary, else the call in words."""
    said = word_approval(agents, approval.agent, approval.interrupt, approval.input)
    return said.summary if said.declared else in_words(approval.interrupt, approval.input)


async def _find(store: SqlSessionStore, value: str) -> tuple[PendingApproval, bool]:
    """The approval ``value`` names (its id, or one with the turn id cut to a unique prefix)
    and whether it is still open; :class:`NotFound` when there is none."""
    key = await resolve_approval(store, value)
    found = await find_approval(store, *key) if key is not None else None
    if found is None:
        raise NotFound(f"no approval {value!r}; list open ones with `turnstile approvals ls`.")
    return found


# -- ls ------------------------------------------------------------------------------------


@dataclass
class _Listed:
    """What ``approvals ls`` found: the approvals, who holds each, and each turn id's short
    form (empty unless a table shows them)."""

    rows: list[PendingApproval]
    held: dict[tuple[str, int, str], Assignment]
    short_ids: dict[str, str]

    def stored(self, approval: PendingApproval) -> Assignment | None:
        """Who holds ``approval`` (``None``: nothing stored)."""
        return self.held.get((approval.turn_id, approval.round, approval.ref))

    def holder(self, approval: PendingApproval) -> Assignment:
        """Who holds ``approval`` (nobody: an empty assignment)."""
        return self.stored(approval) or NOBODY

    def short_id(self, approval: PendingApproval) -> str:
        """The approval's id with its turn id cut to its shortest unique prefix."""
        return approval_id(self.short_ids.get(approval.turn_id, approval.turn_id), approval.ref)


async def _listed(
    store: SqlSessionStore, query: ApprovalQuery, app: Engine | None, *, short: bool
) -> _Listed:
    rows = await store.list_approvals(query)
    if app is not None:
        held = await current_assignments(app.agents, rows)
    else:
        held = await store.get_assignments([(a.turn_id, a.round, a.ref) for a in rows])
    short_ids = (
        await store.id_prefixes("turn", [a.turn_id for a in rows], shortest=SHORT_ID)
        if short
        else {}
    )
    return _Listed(rows, held, short_ids)


@approvals.command("ls")
@db_option
@option(
    "--app",
    default=None,
    metavar="MODULE:ATTR",
    help="the app's Engine: say what each approval asks in its words, show default groups",
)
@option("--agent", multiple=True, help="only this agent's approvals (repeatable)")
@option("--interrupt", default=None, help="only approvals of this interrupt")
@option("--older-than", type=Age(), default=None, help="only approvals at least this old: 1h, 1d")
@limit_option(50, 1000)
@wide_option
@json_option
def ls(
    db: str | None,
    app: str | None,
    agent: tuple[str, ...],
    interrupt: str | None,
    older_than: float | None,
    limit: int,
    wide: bool,
    as_json: bool,
) -> int:
    """List open approvals, oldest first: what each asks, and its id (the turn id's first
    characters: enough to name it)."""
    now = datetime.now(UTC)
    query = ApprovalQuery(
        agents=agent or None,
        interrupt=interrupt,
        created_before=now - timedelta(seconds=older_than) if older_than else None,
        limit=limit,
    )
    abbreviate = not (wide or as_json)
    found, agents = _read(db, app, lambda s, engine: _listed(s, query, engine, short=abbreviate))
    holder = found.holder

    print_columns(
        found.rows,
        as_json=as_json,
        wide=wide,
        wire=lambda a: approval_wire(a, now, agents) | assignment_fields(found.stored(a)),
        empty="No open approvals match.",
        columns=[
            Column("ID", found.short_id, is_id=True),
            Column("ASKED", lambda a: _asked(a, agents), folds=True),
            Column("AGENT", lambda a: a.agent),
            Column("AGE", lambda a: ago(a.created_at, now)),
            Column("DEADLINE", lambda a: iso(a.deadline)),
            Column("ASSIGNEE", lambda a: holder(a).assignee),
            Column("GROUP", lambda a: _group_text(holder(a))),
        ],
        wide_columns=[
            Column("ID", lambda a: approval_id(a.turn_id, a.ref), is_id=True),
            Column("AGENT", lambda a: a.agent),
            Column("VERSION", lambda a: a.app_version),
            Column("INTERRUPT", lambda a: a.interrupt),
            Column("INPUT", lambda a: short(a.input, None)),
            Column("AGE", lambda a: ago(a.created_at, now)),
            Column("DEADLINE", lambda a: iso(a.deadline)),
            Column("ASSIGNEE", lambda a: holder(a).assignee),
            Column("GROUP", lambda a: _group_text(holder(a))),
            Column("SESSION", lambda a: a.session_id, is_id=True),
        ],
    )
    return 0


# -- show ----------------------------------------------------------------------------------


def _edit_line(answer: Any) -> str | None:
    """The arguments an approver edited, as ``amount: 40 → 500 (by bob at ...)``."""
    edit = answer.get("edit") if isinstance(answer, dict) else None
    if not isinstance(edit, dict):
        return None
    changes = "; ".join(
        f"{c.get('field')}: {json.dumps(c.get('old'))} → {json.dumps(c.get('new'))}"
        for c in edit.get("diff") or []
    )
    return f"{changes} (by {edit.get('by') or 'an anonymous approver'} at {edit.get('at')})"


def _progress_wire(where: EscalationProgress | None) -> dict[str, Any] | None:
    """``show --json``'s ``escalation`` (``None``: no ``--app``, or no chain)."""
    if where is None:
        return None
    upcoming = where.next
    return {
        "step": where.reached,
        "steps": where.total,
        "next_group": upcoming.group if upcoming else None,
        "next_at": iso(upcoming.due_at) if upcoming else None,
    }


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
) -> tuple[
    PendingApproval, bool, ToolCallRecord, list[ToolCallRecord], list[Message], Assignment | None
]:
    approval, is_open = await _find(store, value)
    turn_id, ref = approval.turn_id, approval.ref
    calls = [c for c in await store.list_calls(turn_id) if c.round == approval.round]
    call = next(c for c in calls if c.ref == ref)
    conversation = await store.load_conversation(turn_id)
    key = (turn_id, approval.round, ref)
    held = (await store.get_assignments([key])).get(key)
    return approval, is_open, call, [c for c in calls if c.ref != ref], conversation, held


@approvals.command("show", short_help="One approval: input, paused call, conversation.")
@click.argument("approval", metavar="ID")
@db_option
@option(
    "--app",
    default=None,
    metavar="MODULE:ATTR",
    help="the app's Engine: what the approval asks in its words, where it is in its chain",
)
@named_option("--full", "full", is_flag=True, help="the whole conversation before the pause")
@json_option
def show(approval: str, db: str | None, app: str | None, full: bool, as_json: bool) -> int:
    """Show one approval: what it asks, the call it pauses, and the conversation before it."""
    (entry, is_open, call, siblings, conversation, held), agents = _read(
        db, app, lambda store, _engine: _read_approval(store, approval)
    )
    chain_progress = _escalation_progress(agents, entry, held, is_open)
    now = datetime.now(UTC)
    before = conversation[:-1]  # the last message is the paused model message
    if as_json:
        described = approval_wire(entry, now, agents)
        described.update(
            {
                "open": is_open,
                "state": _state(call, is_open),
                "answer": call.answer,
                "decided_by": call.decided_by,
                "decided_at": iso(call.decided_at),
                **assignment_fields(held),
                "escalation": _progress_wire(chain_progress),
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
    said = word_approval(agents, entry.agent, entry.interrupt, entry.input)
    out.print(
        fields(
            {
                "asks": _asked(entry, agents),
                "title": said.title if said.titled else None,
                "approval": approval_id(entry.turn_id, entry.ref),
                "state": _state(call, is_open),
                "agent": entry.agent,
                "session": entry.session_id,
                "owner": entry.owner,
                "asked": f"{iso(entry.created_at)} ({ago(entry.created_at, now)} ago)",
                "deadline": iso(entry.deadline),
                "assigned": _assigned_text(held),
                "escalation": chain_progress.describe(iso) if chain_progress else None,
                "decided": f"by {call.decided_by or 'an anonymous approver'} at "
                f"{iso(call.decided_at)}: {json.dumps(call.answer)}"
                if call.decided_at
                else None,
                "edited": _edit_line(call.answer),
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


def _decision(
    verb: str, answer: Any, approval: PendingApproval, app: Engine, edit: Any = None
) -> Decision:
    """The decision ``verb`` makes with ``answer`` (``None``: none was given) and ``edit``
    (fields of the call's arguments to change; it restarts the call with them)."""
    tool = app.agents[approval.agent].tools.get(approval.interrupt)
    if edit is not None and verb == "deny":
        raise click.UsageError("--edit goes with approve or restart: the edited call runs.")
    if not isinstance(edit, dict | None):
        raise click.BadParameter("must be a JSON object of fields to change", param_hint="--edit")
    if verb == "restart":
        return Decision(restart=True, resumed=answer, edit=edit)
    self_paused = tool is not None and not tool.is_interrupt
    if verb == "approve" and answer is None and (edit is not None or self_paused):
        # Approving a tool that paused itself runs it (with the edited arguments, if any).
        return Decision(restart=True, edit=edit)
    if edit is not None:
        raise click.UsageError("--edit runs the call: it does not go with --answer.")
    if verb == "deny" and answer is None and self_paused:
        # Its output is a result, not a yes or no: saying no to such a tool is a reject.
        raise Refused(
            f"'{approval.interrupt}' paused itself: its answer is the tool's result, not a no. "
            f"Reject it instead: `turnstile approvals reject "
            f"{approval_id(approval.turn_id, approval.ref)} --reason TEXT --by NAME`."
        )
    approved = verb == "approve"
    if answer is None:
        schema = tool.output.json_schema() if tool is not None else None
        answer = yes_no_answer(schema, approved)
        if answer is None:
            raise Refused(
                f"'{approval.interrupt}' answers more than yes or no: give --answer JSON "
                f"matching its output schema {json.dumps(schema)}"
                + (", or say no with `turnstile approvals reject`." if not approved else ".")
            )
    elif _contradicts(answer, approved):
        other = "deny" if approved else "approve"
        raise Refused(
            f"{verb} with the answer {json.dumps(answer)} contradicts itself; use "
            f"`turnstile approvals {other}`."
        )
    return Decision(respond=answer)


async def _decide_on_store(
    store: SqlSessionStore, engine: Engine, app: str, approval: str, by: str, make: Any
) -> tuple[str, DecisionOutcome]:
    """Decide ``approval`` (an id, or one with a unique prefix of its turn id) with the
    decision ``make(entry)`` builds, as ``by``; its whole id and the outcome. The engine's
    refusals become the CLI's (exit 1 for a decision the state refuses, 2 for a bad one)."""
    entry, is_open = await _find(store, approval)
    named = approval_id(entry.turn_id, entry.ref)
    agent = agent_of(engine, entry.agent, app)
    if not is_open:
        raise Declined(
            f"approval {named} is no longer pending: it was decided or answered "
            f"already (see `turnstile approvals show {named}`)."
        )
    decision = make(entry)
    try:
        return named, await decide(agent, entry, decision, decided_by=by)
    except (ApprovalNotPendingError, FailedPreconditionError) as exc:
        # Decided meanwhile, or a definition the app can no longer resume: the
        # engine refuses (exit 1); a bad answer is the operator's usage error (2).
        raise Declined(f"{exc} (see `turnstile approvals show {named}`)") from exc
    except InvalidArgumentError as exc:
        raise Refused(str(exc)) from exc


def _open_deciding_app(app_spec: str, db: str | None, *, dev: bool) -> tuple[Engine, str]:
    """The app a decision resumes turns through, checked as ``turnstile worker`` checks it:
    a client-managed agent signing with a published or missing key is refused unless
    ``dev``, which also lets a turn paused before a prompt edit resume."""
    engine, url = open_app(app_spec, db)
    check_keys(engine, dev=dev)
    if dev:
        allow_prompt_edits(engine)
    return engine, url


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
    @named_option(
        "--edit",
        "edit",
        type=JsonText(),
        default=None,
        help='change the call\'s arguments, then run it: JSON fields, e.g. {"amount": 500} '
        "(tools declared editable=True)",
    )
    @option("--by", required=True, metavar="NAME", help="who decides (recorded as decided_by)")
    @option("--app", required=True, metavar="MODULE:ATTR", help="the app's Engine")
    @db_option
    @dev_option
    @json_option
    def command(
        approval: str,
        answer: Any,
        answer_file: str | None,
        edit: Any,
        by: str,
        app: str,
        db: str | None,
        dev: bool,
        as_json: bool,
    ) -> int:
        given = _answer_value(answer, answer_file)
        if not by.strip():
            raise click.BadParameter("must name who decides", param_hint="--by")
        engine, url = _open_deciding_app(app, db, dev=dev)

        async def run(store: SqlSessionStore) -> tuple[str, DecisionOutcome]:
            return await _decide_on_store(
                store,
                engine,
                app,
                approval,
                by,
                lambda entry: _decision(verb, given, entry, engine, edit),
            )

        named, outcome = run_on_app(engine, url, run)
        _report(named, outcome, as_json=as_json)
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


@approvals.command(
    "reject",
    help="Reject an open approval with a reason: the call never runs and the model reads "
    "a refusal carrying the reason (any approval, a tool that paused itself included).",
    short_help="Reject an open approval with a reason.",
)
@click.argument("approval", metavar="ID")
@option(
    "--reason",
    required=True,
    metavar="TEXT",
    help=f"why (recorded, and read by the model; 1 to {MAX_REASON_LENGTH} characters)",
)
@option("--by", required=True, metavar="NAME", help="who decides (recorded as decided_by)")
@option("--app", required=True, metavar="MODULE:ATTR", help="the app's Engine")
@db_option
@dev_option
@json_option
def reject_command(
    approval: str, reason: str, by: str, app: str, db: str | None, dev: bool, as_json: bool
) -> int:
    if not by.strip():
        raise click.BadParameter("must name who decides", param_hint="--by")
    try:
        decision = Decision(reject=Rejection(reason=reason))
    except ValidationError as exc:
        raise click.BadParameter(
            f"must be 1 to {MAX_REASON_LENGTH} characters, not only spaces",
            param_hint="--reason",
        ) from exc
    engine, url = _open_deciding_app(app, db, dev=dev)

    async def run(store: SqlSessionStore) -> tuple[str, DecisionOutcome]:
        return await _decide_on_store(store, engine, app, approval, by, lambda _entry: decision)

    named, outcome = run_on_app(engine, url, run)
    _report(named, outcome, as_json=as_json)
    return 0


# -- assignment ----------------------------------------------------------------------------


def _assignment_command(verb: str, help_text: str) -> click.Command:
    @approvals.command(verb, help=help_text, short_help=help_text.split(" (")[0].rstrip(".") + ".")
    @click.argument("approval", metavar="ID")
    @option("--by", required=True, metavar="NAME", help="who acts (recorded as assigned_by)")
    @named_option("--to", "to", default=None, metavar="NAME", help="assign: the person")
    @named_option("--group", "group", default=None, metavar="ROLE", help="assign: the group")
    @option("--app", required=True, metavar="MODULE:ATTR", help="the app's Engine")
    @db_option
    @json_option
    def command(
        approval: str,
        by: str,
        to: str | None,
        group: str | None,
        app: str,
        db: str | None,
        as_json: bool,
    ) -> int:
        if not by.strip():
            raise click.BadParameter("must name who acts", param_hint="--by")
        if verb != "assign" and (to or group):
            raise click.UsageError(f"--to and --group go with `approvals assign`, not {verb}.")
        if verb == "assign" and not (to or group):
            raise click.UsageError("assign needs --to NAME, --group ROLE, or both.")
        engine, url = open_app(app, db)

        async def act(entry: PendingApproval) -> Assignment:
            agent = agent_of(engine, entry.agent, app)
            if verb == "claim":
                return await claim(agent, entry, NamedApprover(id=by), operator=True)
            if verb == "release":
                return await release(agent, entry, by=None, operator=by)
            return await assign(agent, entry, by=None, assignee=to, group=group, operator=by)

        async def run(store: SqlSessionStore) -> tuple[str, Assignment]:
            entry, _is_open = await _find(store, approval)
            named = approval_id(entry.turn_id, entry.ref)
            try:
                return named, await act(entry)
            except (ApprovalNotPendingError, ApprovalClaimedError, ApprovalRefusedError) as exc:
                raise Declined(f"{exc} (see `turnstile approvals show {named}`)") from exc
            except InvalidArgumentError as exc:
                raise Refused(str(exc)) from exc

        named, held = run_on_app(engine, url, run)
        if as_json:
            emit_json({"id": named, **assignment_fields(held)})
        else:
            click.echo(f"{named}: assigned to {held.describe()} (by {held.assigned_by})")
        return 0

    return command


claim_command = _assignment_command(
    "claim", "Claim an open approval for --by (refused while someone else holds it)."
)
assign_command = _assignment_command(
    "assign",
    "Assign an open approval to a person (--to) and/or a group (--group); a group alone "
    "clears the person.",
)
release_command = _assignment_command(
    "release", "Release an open approval: nobody holds it in person, its group stays."
)
