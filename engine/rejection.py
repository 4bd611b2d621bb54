"""Rejecting an approval: the call's effect never runs, and the model reads a refusal.

Genkit answers a paused call in two ways only: respond (an output in the tool's place) or
restart (run it). An approver who says no to a tool that guards itself had to invent its
output ("transaction id: DENIED"), which the model then reported as a success. A *reject*
is a third answer, recorded in the journal as ``{"reject": {"reason", "by", "at"}}``; the
resume answers the call with an ordinary ``toolResponse`` whose output is a refusal object
(:func:`refusal_output`) and whose metadata carries :data:`REJECTED`, so the model, the
transcript and the history can tell it from a result. The refusal is not the tool's output
and is not validated against its output schema; a resume may carry one only for a call whose
recorded decision is exactly that reject (:func:`recorded_rejection`), so a client cannot
use the mark to slip an unvalidated output past the schema.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints, model_validator

from engine.conversation.parts import REJECTED, Part
from engine.store import ToolCallRecord

__all__ = [
    "MAX_REASON_LENGTH",
    "REJECT",
    "Rejection",
    "recorded_rejection",
    "refusal_output",
    "rejection_part",
    "rejection_record",
]

#: The journal answer's key for a reject.
REJECT = "reject"
#: The longest reason accepted (a reason is a sentence or a paragraph, not a document).
MAX_REASON_LENGTH = 2000


class Rejection(BaseModel):
    """A reject's payload as an approver gives it: a reason, required and bounded."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_REASON_LENGTH)
    ]

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        # ``Decision(reject="too much")`` reads as ``{"reason": "too much"}``.
        return {"reason": value} if isinstance(value, str) else value


def rejection_record(
    rejection: Rejection, *, by: str | None, at: datetime | None = None
) -> dict[str, Any]:
    """The journal's form of a reject: ``{"reason", "by", "at"}``."""
    when = at or datetime.now(UTC)
    return {"reason": rejection.reason, "by": by, "at": when.isoformat()}


def refusal_output(record: dict[str, Any]) -> dict[str, Any]:
    """What the model reads for a rejected call: ``{"rejected": true, "reason", "by"}``."""
    return {"rejected": True, "reason": record.get("reason"), "by": record.get("by")}


def rejection_part(call: ToolCallRecord, record: dict[str, Any]) -> Part:
    """The ``toolResponse`` that answers ``call`` with the refusal of ``record``."""
    return Part.of_response(call.name, call.ref, refusal_output(record), {REJECTED: record})


def recorded_rejection(row: ToolCallRecord | None) -> dict[str, Any] | None:
    """The reject recorded as the decision on journal row ``row`` (``None``: none)."""
    if row is None or row.decided_at is None or not isinstance(row.answer, dict):
        return None
    record = row.answer.get(REJECT)
    return record if isinstance(record, dict) else None
