"""How the pages show JSON values, schemas, messages and moments to a person.

Values are turned into text here, never into markup: the templates escape everything they
print, so a tool argument or a model's text cannot inject HTML into a page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from engine.approvals import wording
from engine.conversation.parts import Message, Part

__all__ = [
    "MessageView",
    "PartView",
    "Row",
    "ago",
    "answer_summary",
    "edit_summary",
    "format_value",
    "input_summary",
    "message_views",
    "moment",
    "outcome",
    "schema_rows",
    "value_rows",
]

#: Longest text a one-line summary shows before cutting it short.
_SUMMARY_CHARS = 120


@dataclass(frozen=True)
class Row:
    """One labelled value: a property of an object, an argument of a call."""

    label: str
    value: str
    description: str | None = None
    #: The raw key (a table's first column when it differs from the label).
    key: str = ""
    #: Long or structured: shown as preformatted text.
    block: bool = False


@dataclass(frozen=True)
class PartView:
    """One part of a message, ready to show."""

    kind: str
    text: str = ""
    name: str = ""
    ref: str = ""
    rows: tuple[Row, ...] = ()


@dataclass(frozen=True)
class MessageView:
    """One message of a conversation, ready to show."""

    role: str
    parts: tuple[PartView, ...]


#: A JSON value as a person reads it: Yes/No, an em dash for null, JSON for structures.
format_value = wording.plain_value


def _row(key: str, label: str, value: Any, description: str | None = None) -> Row:
    text = format_value(value)
    return Row(
        label=label,
        value=text,
        description=description,
        key=key,
        block=isinstance(value, dict | list) or "\n" in text or len(text) > 200,
    )


def value_rows(value: Any) -> tuple[Row, ...]:
    """The rows of a table showing ``value``: one per key of an object, else one row."""
    if isinstance(value, dict):
        return tuple(_row(str(k), str(k), v) for k, v in value.items())
    return (_row("", "Value", value),)


def schema_rows(schema: Mapping[str, Any] | None, value: Any) -> tuple[Row, ...]:
    """``value`` labelled by its JSON schema: each property's title and description, in the
    schema's order, then any keys the schema does not name."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(value, dict) or not isinstance(properties, dict):
        return value_rows(value)
    rows: list[Row] = []
    for name, spec in properties.items():
        if name not in value:
            continue
        spec = spec if isinstance(spec, dict) else {}
        title = spec.get("title") if isinstance(spec.get("title"), str) else None
        description = spec.get("description")
        rows.append(
            _row(
                name,
                title or name,
                value[name],
                description if isinstance(description, str) else None,
            )
        )
    rows.extend(_row(str(k), str(k), v) for k, v in value.items() if k not in properties)
    return tuple(rows)


def _cut(text: str) -> str:
    return wording.one_line(text, _SUMMARY_CHARS)


def input_summary(value: Any) -> str:
    """A one-line summary of an interrupt's input for a list: its string values, joined."""
    return wording.input_summary(value, _SUMMARY_CHARS)


def answer_summary(answer: Any) -> str:
    """A decision in one line: the respond output's fields, that the tool was restarted, or
    ``rejected: <reason>``."""
    if not isinstance(answer, dict):
        return format_value(answer)
    if isinstance(answer.get("reject"), dict):
        return _cut(f"rejected: {answer['reject'].get('reason')}")
    if "restart" in answer and isinstance(answer.get("edit"), dict):
        return f"Approved with edited arguments: {edit_summary(answer['edit'])}"
    if "restart" in answer:
        return "Restarted (the tool runs again)"
    output = answer.get("respond")
    if isinstance(output, dict):
        return _cut("; ".join(f"{k}: {format_value(v)}" for k, v in output.items()))
    return _cut(format_value(output))


def edit_summary(edit: Any) -> str:
    """An approver's edit in one line: ``amount: 40 → 500 (by bob)``."""
    if not isinstance(edit, dict):
        return ""
    changes = []
    for change in edit.get("diff") or []:
        old = format_value(change["old"]) if "old" in change else "(none)"
        new = format_value(change["new"]) if "new" in change else "(removed)"
        changes.append(f"{change.get('field')}: {old} → {new}")
    who = f" (by {edit['by']})" if edit.get("by") else ""
    return "; ".join(changes) + who


def escalation_summary(
    from_group: str | None, from_assignee: str | None, to_group: str | None, *, step: int = 1
) -> str:
    """Where an escalation moved an approval: ``from group payments (held by dave) to group
    leads``, with ``(step 2)`` past a chain's first step."""
    source = f"group {from_group}" if from_group else "no group"
    held = f" (held by {from_assignee})" if from_assignee else ""
    target = f"group {to_group}" if to_group else "no group"
    reached = f" (step {step})" if step > 1 else ""
    return f"from {source}{held} to {target}{reached}"


def _call_view(kind: str, name: str, ref: str | None, value: Any) -> PartView:
    """A tool call's request or response: the tool, the call's ref and the value as rows."""
    return PartView(kind=kind, name=name, ref=ref or "", rows=value_rows(value))


def _part_view(part: Part) -> PartView:
    if part.text is not None:
        return PartView(kind="text", text=part.text)
    if part.tool_request is not None:
        request = part.tool_request
        return _call_view("request", request.name, request.ref, request.input)
    if part.tool_response is not None:
        response = part.tool_response
        return _call_view("response", response.name, response.ref, response.output)
    if part.reasoning is not None:
        return PartView(kind="reasoning", text=part.reasoning)
    return PartView(kind="other", text=format_value(part.to_wire()))


def message_views(messages: list[Message]) -> tuple[MessageView, ...]:
    """A conversation, ready to show."""
    return tuple(
        MessageView(role=str(message.role), parts=tuple(_part_view(p) for p in message.content))
        for message in messages
    )


def moment(value: datetime | None) -> str:
    """A moment in UTC to the second (the browser's script shows it in local time)."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(value: datetime | None, now: datetime) -> str:
    """How long ago (or how far ahead) ``value`` is, roughly: ``3 min ago``, ``in 2 h``."""
    if value is None:
        return ""
    seconds = (now - value).total_seconds()
    ahead = seconds < 0
    span = abs(seconds)
    if span < 60:
        text = f"{int(span)} s"
    elif span < 3600:
        text = f"{int(span // 60)} min"
    elif span < 86400:
        text = f"{int(span // 3600)} h"
    else:
        text = f"{int(span // 86400)} d"
    return f"in {text}" if ahead else f"{text} ago"


def turn_state(status: str, finish_reason: str | None, *, continued: bool) -> str:
    """What happened to a turn, in words, for its own page: a turn that paused says whether
    its approvals were answered and the session continued (``continued``), or it still
    waits; any other state as :func:`outcome` says it."""
    if status == "completed" and finish_reason == "interrupted":
        return "paused, answered and continued" if continued else "paused (waiting for approval)"
    return outcome(status, finish_reason)


def outcome(status: str | None, finish_reason: str | None) -> str:
    """The state of the turn that continued a paused one, in words: ``completed``,
    ``paused again``, ``queued or running``, …"""
    if status is None:
        return "not continued yet"
    if status == "pending":
        return "queued or running"
    if status == "completed" and finish_reason == "interrupted":
        return "paused again (waiting for approval)"
    if status == "completed" and finish_reason not in (None, "stop"):
        return f"completed ({finish_reason})"
    return status
