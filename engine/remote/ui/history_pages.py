"""The history: decided approvals with who decided, when, the answer and what the turn did
next; filterable, paged, and exported as CSV with the same filters."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from engine.agent import Agent
from engine.approvals.decide import approval_id
from engine.approvals.wording import word_approval
from engine.remote.ui import present
from engine.remote.ui.kit import PageKit, Viewer, query_of
from engine.remote.ui.queries import HistoryFilters
from engine.store import DecidedApproval

__all__ = ["MAX_EXPORT_ROWS", "HistoryPages"]

PAGE_SIZE = 50
#: The most rows one CSV export holds (narrow the filters for more).
MAX_EXPORT_ROWS = 10_000
_EXPORT_PAGE = 500
CSV_COLUMNS = (
    "decided_at",
    "agent",
    "interrupt",
    "summary",
    "turn_id",
    "ref",
    "session_id",
    "requester",
    "decided_by",
    "answer",
    "outcome",
    "next_turn_id",
    "next_status",
    "next_finish_reason",
    "edit",
    "edited_by",
    "edited_at",
    "escalated_at",
    "escalated_from_group",
    "escalated_from_assignee",
    "escalated_to",
    "escalation_step",
    # What was approved: the decision in words, and the arguments it was made on.
    "decision",
    "arguments",
)


def _escalation(entry: DecidedApproval) -> str:
    if entry.escalated_at is None:
        return ""
    return present.escalation_summary(
        entry.escalated_from_group,
        entry.escalated_from_assignee,
        entry.escalated_to,
        step=entry.escalation_step,
    )


def _outcome(entry: DecidedApproval) -> str:
    return present.outcome(
        entry.next_status.value if entry.next_status else None,
        entry.next_finish_reason.value if entry.next_finish_reason else None,
    )


def csv_cell(value: Any) -> str:
    """A CSV cell that a spreadsheet shows as text: a leading ``=``, ``+``, ``-``, ``@``,
    tab or carriage return would make it a formula, so such a cell starts with ``'``."""
    text = "" if value is None else str(value)
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


class HistoryPages:
    """``GET /ui/history`` and ``GET /ui/history.csv``."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit

    async def history(self, request: Request, viewer: Viewer) -> Response:
        """A page of decided approvals, newest decision first."""
        filters = HistoryFilters.from_query(query_of(request))
        catalog = self.kit.catalog
        page = await catalog.decided_approvals(viewer.principal, filters, limit=PAGE_SIZE)
        rows = [
            {
                "entry": entry,
                "id": approval_id(entry.turn_id, entry.ref),
                "answer": present.answer_summary(entry.answer),
                "outcome": _outcome(entry),
                "escalation": _escalation(entry),
            }
            for entry in page.items
        ]
        context = {
            "nav": "history",
            "filters": filters,
            "rows": rows,
            "agents": catalog.agent_names(),
            "interrupts": catalog.interrupt_names(),
            "next_query": filters.query(cursor=page.next_cursor) if page.next_cursor else None,
            "first_query": filters.query(cursor=None) if filters.cursor else None,
            "csv_query": filters.query(cursor=None),
            "max_export": MAX_EXPORT_ROWS,
        }
        return self.kit.page(request, viewer, "history.html", context)

    async def export(self, request: Request, viewer: Viewer) -> Response:
        """The filtered history as CSV, newest first, up to :data:`MAX_EXPORT_ROWS` rows."""
        filters = HistoryFilters.from_query(query_of(request))
        catalog = self.kit.catalog
        agents = catalog.engine.agents

        async def lines() -> AsyncIterator[str]:
            buffer = io.StringIO()
            writer = csv.writer(buffer)
            writer.writerow(CSV_COLUMNS)
            sent = 0
            current = filters
            # Bounded reads, also for a viewer who may see few of the rows the stores hold.
            for _ in range(2 * MAX_EXPORT_ROWS // _EXPORT_PAGE):
                if sent >= MAX_EXPORT_ROWS:
                    break
                page = await catalog.decided_approvals(
                    viewer.principal, current, limit=min(_EXPORT_PAGE, MAX_EXPORT_ROWS - sent)
                )
                for entry in page.items:
                    writer.writerow([csv_cell(v) for v in _csv_row(entry, agents)])
                sent += len(page.items)
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
                if page.next_cursor is None:
                    break
                current = replace(filters, cursor=page.next_cursor)

        response = StreamingResponse(
            lines(),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": 'attachment; filename="approval-history.csv"'},
        )
        return self.kit.finish(response, request, viewer)


def _csv_row(entry: DecidedApproval, agents: Mapping[str, Agent]) -> list[Any]:
    return [
        entry.decided_at.isoformat(),
        entry.agent,
        entry.interrupt,
        # What was approved, in the words the approver read.
        word_approval(agents, entry.agent, entry.interrupt, entry.input).summary,
        entry.turn_id,
        entry.ref,
        entry.session_id,
        entry.owner,
        entry.decided_by,
        json.dumps(entry.answer, ensure_ascii=False),
        _outcome(entry),
        entry.next_turn_id,
        entry.next_status.value if entry.next_status else None,
        entry.next_finish_reason.value if entry.next_finish_reason else None,
        present.edit_summary(edit) if (edit := entry.edit) else None,
        edit.get("by") if edit else None,
        edit.get("at") if edit else None,
        entry.escalated_at.isoformat() if entry.escalated_at else None,
        entry.escalated_from_group,
        entry.escalated_from_assignee,
        entry.escalated_to,
        entry.escalation_step,
        present.answer_summary(entry.answer),
        json.dumps(edit["input"] if edit and "input" in edit else entry.input, ensure_ascii=False),
    ]
