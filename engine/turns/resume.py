"""Resume validation and resolution: pure functions over the paused model message.

Validation happens before anything is written; every violation is a typed error with
Genkit's wording where Genkit has one, so the paused snapshot stays resumable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.approval_policy import check_decided_by_inbox
from engine.conversation.parts import (
    PENDING_OUTPUT,
    REJECTED,
    RESUMED,
    Message,
    Part,
    paused_calls,
)
from engine.conversation.schemas import SchemaViolation, canonical_json, to_jsonable
from engine.errors import (
    ApprovalNotPendingError,
    FailedPreconditionError,
    InvalidArgumentError,
    ResumeValidationError,
    SnapshotNotResumableError,
)
from engine.rejection import REJECT, recorded_rejection, refusal_output
from engine.store import EDIT, InterruptAnswer, ToolCallRecord, ToolCallStatus, TurnInput
from engine.store.rules import check_recorded
from engine.tools import Tool

__all__ = [
    "NOT_RESUMABLE_MESSAGE",
    "ResumePlan",
    "edited_key",
    "expiry_decisions",
    "plan_continuation",
    "plan_resume",
    "recorded_edit",
]

NOT_RESUMABLE_MESSAGE = (
    "Cannot 'resume' generation unless the previous message is a model message with at least "
    "one tool request."
)


def _ref_text(ref: str | None) -> str:
    return f" (ref: {ref})" if ref is not None else ""


@dataclass(frozen=True)
class ResumePlan:
    """A validated resume: for each paused ref, ``("respond", output)``,
    ``("restart", resumed_metadata)`` or ``("reject", recorded_reject)``; plus the journal
    rows the answers close, and for a restart with edited arguments, the recorded edit it
    carries out (by ref)."""

    answers: Mapping[str, tuple[str, Any]]
    journal: Sequence[ToolCallRecord]
    edits: Mapping[str, dict[str, Any]] = field(default_factory=dict)

    def answer_of(self, ref: str) -> dict[str, Any]:
        """The journal answer of paused call ``ref`` (with its recorded edit, if any)."""
        return _journal_answer(self.answers, self.edits, ref)

    def decisions(self, snapshot_id: str, decided_by: str | None) -> list[InterruptAnswer]:
        """The answers to record with the resuming turn, one per paused call. An answer the
        inbox recorded earlier, unchanged, keeps the name of who decided it."""
        decisions = []
        for row in self.journal:
            answer = self.answer_of(row.ref)
            decider = decided_by
            if row.decided_at is not None and row.answer == answer:
                decider = row.decided_by
            decisions.append(
                InterruptAnswer(
                    turn_id=snapshot_id,
                    round=row.round,
                    ref=row.ref,
                    decided_by=decider,
                    answer=answer,
                )
            )
        return decisions


def _journal_answer(
    answers: Mapping[str, tuple[str, Any]], edits: Mapping[str, dict[str, Any]], ref: str
) -> dict[str, Any]:
    kind, value = answers[ref]
    answer: dict[str, Any] = {kind: value}
    if ref in edits:
        answer[EDIT] = edits[ref]
    return answer


def _edit_allowing(
    row: ToolCallRecord | None, tool: Tool | None, requested_input: Any
) -> dict[str, Any] | None:
    """The recorded edit that makes a restart with ``requested_input`` legitimate: one an
    allowed approver recorded through the inbox on an editable tool, with exactly these
    arguments (``None``: there is none, and the changed input is refused)."""
    edit = recorded_edit(row)
    if edit is None or tool is None or not tool.editable:
        return None
    return edit if canonical_json(edit["input"]) == canonical_json(requested_input) else None


def _rejection_allowing(row: ToolCallRecord | None, part: Part, snapshot_id: str) -> dict[str, Any]:
    """The recorded reject a respond part marked :data:`REJECTED` carries out: only a call an
    approver rejected through the inbox, with exactly that refusal, may be answered without
    its output schema (a client adding the mark to any output is refused)."""
    response = part.tool_response
    assert response is not None
    record = recorded_rejection(row)
    if (
        record is None
        or canonical_json(part.meta()[REJECTED]) != canonical_json(record)
        or canonical_json(to_jsonable(response.output)) != canonical_json(refusal_output(record))
    ):
        raise ResumeValidationError(
            f"resume.respond for tool '{response.name}'{_ref_text(response.ref)} is marked "
            f"'{REJECTED}', but no reject with that refusal was recorded for it; reject an "
            "approval through the inbox (POST /inbox/{id}/decision).",
            snapshot_id=snapshot_id,
        )
    return record


def expiry_decisions(
    snapshot_id: str, journal: Sequence[ToolCallRecord], decided_by: str | None
) -> list[InterruptAnswer]:
    """The answers that close every still-paused call of a snapshot as expired."""
    return [
        InterruptAnswer(
            turn_id=snapshot_id,
            round=row.round,
            ref=row.ref,
            decided_by=decided_by,
            answer={"expired": True},
        )
        for row in journal
        if row.status is ToolCallStatus.INTERRUPTED
    ]


def plan_resume(
    *,
    snapshot_id: str,
    last_message: Message | None,
    journal: Sequence[ToolCallRecord],
    respond: Sequence[Part],
    restart: Sequence[Part],
    tools: Mapping[str, Tool],
    require_pending: bool = True,
) -> ResumePlan:
    """Check ``respond``/``restart`` against the paused calls of a snapshot.

    Every entry must name a paused call of the snapshot's last message by name and ref; a
    restart must carry the original input, unless it carries exactly the arguments of an edit
    recorded with the call's decision (:mod:`engine.approvals.edits`); a respond's output must
    satisfy the interrupt's output schema, unless it is marked :data:`REJECTED` and carries
    exactly the refusal of a reject recorded with the call's decision
    (:mod:`engine.rejection`); every paused call must be answered exactly once. With
    ``require_pending`` the journal must still show each paused call ``interrupted`` (the runner
    re-reads a plan whose answers were already recorded, so it passes ``False``).
    """
    paused = paused_calls(last_message)
    if not paused:
        raise FailedPreconditionError(NOT_RESUMABLE_MESSAGE, snapshot_id=snapshot_id)
    by_key = {(p.tool_request.name, p.tool_request.ref): p for p in paused if p.tool_request}
    # By ref alone: a migration may have renamed a paused call (its ref stays).
    rows = {c.ref: c for c in journal}
    answers: dict[str, tuple[str, Any]] = {}
    edits: dict[str, dict[str, Any]] = {}

    def locate(kind: str, payload_name: str, ref: str | None) -> Part:
        found = by_key.get((payload_name, ref))
        if found is None:
            raise ResumeValidationError(
                f"resume.{kind} references tool '{payload_name}'{_ref_text(ref)} which was "
                "not found in session history.",
                snapshot_id=snapshot_id,
            )
        assert ref is not None  # paused calls always carry a ref (the engine assigns one)
        if ref in answers:
            raise ResumeValidationError(
                f"resume answers tool '{payload_name}'{_ref_text(ref)} more than once; give "
                "each paused call exactly one respond or restart.",
                snapshot_id=snapshot_id,
            )
        return found

    for part in respond:
        response = part.tool_response
        if response is None:
            raise _wrong_part("respond", "toolResponse", snapshot_id)
        locate("respond", response.name, response.ref)
        if REJECTED in part.meta():
            record = _rejection_allowing(rows.get(str(response.ref)), part, snapshot_id)
            answers[str(response.ref)] = (REJECT, record)
            continue
        tool = tools.get(response.name)
        # Validated against the schema, but kept verbatim: the model sees exactly what the
        # answering client sent (as Genkit passes respond parts through unchanged).
        output = to_jsonable(response.output)
        if tool is not None:
            try:
                tool.output.check_json(output)
            except SchemaViolation as exc:
                raise ResumeValidationError(
                    f"resume.respond for tool '{response.name}'{_ref_text(response.ref)} has an "
                    f"output that does not match the tool's output schema: {exc}",
                    snapshot_id=snapshot_id,
                ) from exc
        answers[str(response.ref)] = ("respond", output)

    for part in restart:
        request = part.tool_request
        if request is None:
            raise _wrong_part("restart", "toolRequest", snapshot_id)
        original = locate("restart", request.name, request.ref)
        assert original.tool_request is not None
        edit = None
        if canonical_json(request.input) != canonical_json(original.tool_request.input):
            edit = _edit_allowing(
                rows.get(str(request.ref)), tools.get(request.name), request.input
            )
        if edit is not None:
            edits[str(request.ref)] = edit
        elif canonical_json(request.input) != canonical_json(original.tool_request.input):
            raise ResumeValidationError(
                f"resume.restart for tool '{request.name}'{_ref_text(request.ref)} has modified "
                "inputs that do not match the original tool request in session history. Restart "
                "inputs must exactly match the interrupted tool request.",
                snapshot_id=snapshot_id,
            )
        resumed = (part.metadata or {}).get(RESUMED, True)
        answers[str(request.ref)] = (
            "restart",
            to_jsonable(resumed) if resumed is not None else True,
        )

    closed = _answered_rows(paused, answers, edits, rows, snapshot_id, require_pending)
    return ResumePlan(answers=answers, journal=closed, edits=edits)


def _wrong_part(kind: str, wanted: str, snapshot_id: str) -> ResumeValidationError:
    """The error for a ``resume.<kind>`` entry that is not a ``wanted`` part."""
    return ResumeValidationError(
        f"resume.{kind} entries must be {wanted} parts (use interrupt.{kind}()).",
        snapshot_id=snapshot_id,
    )


def _answered_rows(
    paused: Sequence[Part],
    answers: Mapping[str, tuple[str, Any]],
    edits: Mapping[str, dict[str, Any]],
    rows: Mapping[str, ToolCallRecord],
    snapshot_id: str,
    require_pending: bool,
) -> list[ToolCallRecord]:
    """Check that every paused call is answered and — with ``require_pending`` — still
    pending in the journal, without a different recorded decision; the rows answered."""
    closed: list[ToolCallRecord] = []
    for p in paused:
        request = p.tool_request
        assert request is not None
        if request.ref not in answers:
            raise ResumeValidationError(
                f"Unresolved tool request '{request.name}#{request.ref}' was not handled by the "
                "'resume' argument. You must supply replies or restarts for all interrupted tool "
                "requests.",
                snapshot_id=snapshot_id,
            )
        row = rows.get(str(request.ref))
        if not require_pending:
            continue
        if row is None or row.status is not ToolCallStatus.INTERRUPTED:
            state = "missing from the journal" if row is None else row.status.value
            raise ApprovalNotPendingError(
                f"Interrupt '{request.name}'{_ref_text(request.ref)} of snapshot {snapshot_id} "
                f"is not pending ({state}); it was answered already.",
                snapshot_id=snapshot_id,
            )
        check_recorded(row, _journal_answer(answers, edits, row.ref), snapshot_id)
        closed.append(row)
    return closed


def strip_pending(part: Part) -> Part:
    """A copy of a request part without ``pendingOutput`` (after it was replayed)."""
    meta = part.meta()
    meta.pop(PENDING_OUTPUT, None)
    copy = part.model_copy(deep=True)
    copy.metadata = meta
    return copy


def plan_continuation(
    turn_input: TurnInput,
    *,
    base_id: str | None,
    conversation: Sequence[Message],
    journal: Sequence[ToolCallRecord],
    tools: Mapping[str, Tool],
    decided_by: str | None,
) -> tuple[list[InterruptAnswer], int]:
    """Check that ``turn_input`` may continue the snapshot ``base_id`` (``None``: a new
    session) whose conversation and journal are given; return the interrupt answers the new
    turn records and how much of the conversation it keeps as history.

    A resume or an expiry answers the paused last message (which the new turn replaces); a
    message or a retry may not continue a snapshot that is paused at interrupts.
    """
    last = conversation[-1] if conversation else None
    if turn_input.kind == "resume":
        if turn_input.message is not None or base_id is None:
            raise FailedPreconditionError(NOT_RESUMABLE_MESSAGE)
        plan = plan_resume(
            snapshot_id=base_id,
            last_message=last,
            journal=journal,
            respond=turn_input.respond,
            restart=turn_input.restart,
            tools=tools,
        )
        check_decided_by_inbox(paused_calls(last), journal, tools)
        return plan.decisions(base_id, decided_by), len(conversation) - 1
    if turn_input.kind == "expire":
        if base_id is None or not paused_calls(last):
            raise FailedPreconditionError(NOT_RESUMABLE_MESSAGE)
        return expiry_decisions(base_id, journal, decided_by), len(conversation) - 1
    pending = paused_calls(last)
    if pending and base_id is not None:
        names = ", ".join(
            f"{p.tool_request.name}#{p.tool_request.ref}" for p in pending if p.tool_request
        )
        raise SnapshotNotResumableError(
            f"Snapshot {base_id} is paused at interrupts ({names}): answer them with "
            "resume(respond=..., restart=...) before sending anything else.",
            snapshot_id=base_id,
        )
    if turn_input.kind == "retry" and base_id is None:
        raise InvalidArgumentError(
            "Nothing to retry: this session has no snapshot yet; send a message."
        )
    return [], len(conversation)


def recorded_edit(row: ToolCallRecord | None) -> dict[str, Any] | None:
    """The edit recorded with the decision on journal row ``row`` (``None``: none)."""
    if row is None or row.decided_at is None or not isinstance(row.answer, dict):
        return None
    edit = row.answer.get(EDIT)
    return edit if isinstance(edit, dict) and "input" in edit else None


def edited_key(original_key: str, edited_input: Any) -> str:
    """The idempotency key of a call run with edited arguments.

    It covers the edited arguments: a crash-retry of the edited call repeats this key (and is
    deduplicated), while an external API that saw the original key with the original
    arguments never mistakes the edited call for a repeat of it.
    """
    digest = hashlib.sha256(canonical_json(edited_input).encode()).hexdigest()[:16]
    return f"{original_key}:edited-{digest}"
