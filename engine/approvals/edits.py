"""Edit before approve: an approver changes the arguments of a paused call, then restarts it.

A tool declared ``editable=True`` that paused itself (``ctx.interrupt()``) may be restarted
with other arguments, but only through the inbox: the approver's changes are merged into the
paused call's arguments, checked against the tool's input schema, and recorded with the
decision as an *edit* — the edited arguments, a per-field diff, who and when. Everywhere else
Genkit's rule holds: a restart must carry the original arguments (see
:func:`engine.turns.resume.plan_resume`, which accepts other arguments only when they are exactly
those of such a recorded edit).

The recorded edit lives in the journal answer: ``{"restart": ..., "edit": {"input": ...,
"diff": [{"field", "old", "new"}], "by": ..., "at": ...}}``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from engine.conversation.schemas import SchemaViolation, canonical_json, to_jsonable
from engine.errors import FailedPreconditionError, InvalidArgumentError
from engine.store import EDIT, EditedMeanwhileError, Vote
from engine.tools import Tool

__all__ = [
    "check_arguments_seen",
    "check_edit_seen",
    "diff_of",
    "make_edit",
    "standing_edit",
]


def diff_of(original: dict[str, Any], edited: dict[str, Any]) -> list[dict[str, Any]]:
    """The fields that differ, in field order: ``{"field", "old", "new"}`` (a field that is
    absent on one side has no ``old`` or no ``new``)."""
    changes: list[dict[str, Any]] = []
    for name in [*original, *(k for k in edited if k not in original)]:
        before, after = original.get(name), edited.get(name)
        if name in original and name in edited and canonical_json(before) == canonical_json(after):
            continue
        change: dict[str, Any] = {"field": name}
        if name in original:
            change["old"] = before
        if name in edited:
            change["new"] = after
        changes.append(change)
    return changes


def make_edit(
    tool: Tool | None,
    name: str,
    original: Any,
    changes: Any,
    *,
    by: str | None,
    at: datetime | None = None,
    current: Any = None,
) -> dict[str, Any]:
    """The recorded edit of a paused call of ``tool`` (named ``name``) whose arguments were
    ``original``: ``changes`` (field → new value, ``null`` removes the field) merged into the
    arguments as they stand (``current``: an earlier edit's, else ``original``). The diff is
    against ``original``, what the model asked for.

    Raises :class:`FailedPreconditionError` when the tool is not editable and
    :class:`InvalidArgumentError` when the changes are not an object of fields, change
    nothing, or leave arguments that violate the tool's input schema.
    """
    if tool is None or not tool.editable or tool.is_interrupt:
        raise FailedPreconditionError(
            f"Tool '{name}' is not editable: its arguments can only be approved as they are "
            "(declare it with editable=True to allow edits)."
        )
    if not isinstance(changes, dict) or not changes:
        raise InvalidArgumentError(
            f"An edit of '{name}' is a JSON object of the fields to change, e.g. "
            '{"amount": 500}.'
        )
    if not isinstance(original, dict):
        raise FailedPreconditionError(
            f"The arguments of this '{name}' call are not an object: they cannot be edited."
        )
    _check_fields(tool, name, original, changes)
    for field, value in changes.items():
        _check_finite(name, field, value)
    standing = current if isinstance(current, dict) else original
    edited = {k: v for k, v in standing.items() if k not in changes}
    edited.update({k: to_jsonable(v) for k, v in changes.items() if v is not None})
    try:
        tool.input.check_json(edited)
    except SchemaViolation as exc:
        raise InvalidArgumentError(
            f"The edited arguments of '{name}' do not match its input schema: {exc}"
        ) from exc
    if not diff_of(standing, edited):
        raise InvalidArgumentError(
            f"The edit of '{name}' changes nothing; approve without an edit instead."
        )
    diff = diff_of(original, edited)
    when = at or datetime.now(UTC)
    return {"input": edited, "diff": diff, "by": by, "at": when.isoformat()}


def _check_fields(tool: Tool, name: str, original: dict[str, Any], changes: dict[str, Any]) -> None:
    """Refuse changes to fields the call cannot have: those its input schema does not declare
    (a schema's silence is not permission: a pydantic model drops an unknown field, a JSON
    schema lets it through, and either way the tool never reads it), or, for a tool without
    a schema, fields the call does not already have."""
    schema = tool.input.json_schema()
    declared = schema.get("properties") if isinstance(schema, dict) else None
    allowed = set(declared) if isinstance(declared, dict) else set(original)
    unknown = sorted(k for k in changes if k not in allowed)
    if unknown:
        raise InvalidArgumentError(
            f"The edit of '{name}' names fields its arguments do not have: "
            f"{', '.join(unknown)} (it may change {', '.join(sorted(allowed)) or 'none'})."
        )


def _check_finite(name: str, path: str, value: Any) -> None:
    """Refuse a number JSON cannot hold (``1e309`` reads as infinity, which would be stored
    as null and then fail the tool)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgumentError(
            f"The edit of '{name}' sets {path} to {value!r}, which is not a finite number."
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(name, f"{path}.{key}", item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_finite(name, f"{path}[{index}]", item)


def check_arguments_seen(name: str, seen: Any, current: Any) -> None:
    """Refuse a decision taken on arguments ``seen`` when the call's arguments are now
    ``current`` (an edit under a quorum changed them): the approver must read them again."""
    if seen is not None and canonical_json(seen) != canonical_json(current):
        raise EditedMeanwhileError(
            f"The arguments of '{name}' were edited after you read them (now "
            f"{canonical_json(current)}); nothing was recorded. Review them and decide again."
        )


def standing_edit(votes: Sequence[Vote]) -> dict[str, Any] | None:
    """The edit the votes on an approval stand on: the latest vote's that carries one (an edit
    resets the votes before it, and every later approval carries it), else ``None``."""
    for vote in reversed(votes):
        edit = vote.answer.get(EDIT) if isinstance(vote.answer, dict) else None
        if isinstance(edit, dict):
            return edit
    return None


def check_edit_seen(
    turn_id: str, ref: str, edit_seen: dict[str, Any] | None, votes: Sequence[Vote]
) -> None:
    """Refuse a vote cast on the standing edit ``edit_seen`` (``None``: the original
    arguments) when ``votes`` now stand on another one: an edit landed after the voter read
    the votes. Stores call it under the lock that records the vote, so that a vote counts only
    towards the arguments its voter saw."""
    standing = standing_edit(votes)
    if canonical_json(standing) != canonical_json(edit_seen):
        now = canonical_json(standing["input"]) if standing is not None else "the original ones"
        raise EditedMeanwhileError(
            f"The arguments of interrupt '{ref}' of snapshot {turn_id} were edited while your "
            f"vote was being recorded (they are now {now}); it was not counted. Review them "
            "and decide again.",
            snapshot_id=turn_id,
        )
