"""How the operator commands print: ``rich`` tables for people, JSON for scripts.

Tables go to standard output; progress bars and notes to standard error, so that standard
output holds only the answer. Without a terminal (a pipe, a file) tables are plain text,
without colour, each as wide as its content (or ``COLUMNS``, when set): nothing is folded
for a script or a log to piece together.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from engine.conversation.parts import Message, Part

__all__ = [
    "ago",
    "console",
    "emit_json",
    "iso",
    "message_text",
    "part_text",
    "print_listing",
    "short",
    "stderr_console",
    "table",
]

T = TypeVar("T")

#: The width of the page for a pipe or a file when ``COLUMNS`` is unset: tables are only as
#: wide as their content, so this is "unbounded".
PIPE_WIDTH = 10_000


def _width(stream: Any) -> int | None:
    if stream.isatty() or os.environ.get("COLUMNS"):
        return None  # rich reads the terminal's width, or COLUMNS
    return PIPE_WIDTH


def console() -> Console:
    """The console of standard output."""
    return Console(width=_width(sys.stdout), highlight=False, soft_wrap=False)


def stderr_console() -> Console:
    """The console of standard error (progress, notes)."""
    return Console(stderr=True, width=_width(sys.stderr), highlight=False)


def emit_json(value: Any) -> None:
    """Print ``value`` as indented JSON on standard output."""
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")


def iso(moment: datetime | None) -> str | None:
    """A moment as ISO 8601 in UTC (``None`` stays ``None``)."""
    return moment.astimezone(UTC).isoformat() if moment is not None else None


def seconds_since(moment: datetime, now: datetime) -> float:
    """Seconds from ``moment`` to ``now``, to the millisecond."""
    return round((now - moment).total_seconds(), 3)


def ago(moment: datetime | None, now: datetime) -> str:
    """How long ago, in the largest unit that fits: ``42s``, ``5m``, ``3h``, ``2d``."""
    if moment is None:
        return ""
    seconds = max(0.0, (now - moment).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def short(value: Any, width: int = 60) -> str:
    """``value`` on one line (JSON unless it is text), cut to ``width`` characters."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def part_text(part: Part) -> str:
    """One part in a few words: its text, or the call or answer it carries."""
    if part.text is not None:
        return part.text
    if part.tool_request is not None:
        request = part.tool_request
        return f"{request.name}#{request.ref}({short(request.input, 200)})"
    if part.tool_response is not None:
        response = part.tool_response
        return f"{response.name}#{response.ref} -> {short(response.output, 200)}"
    return short(part.model_dump(mode="json", exclude_none=True, by_alias=True), 200)


def message_text(message: Message) -> str:
    """A message's parts in a few words each."""
    return " | ".join(part_text(p) for p in message.content)


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    no_wrap: Sequence[str] = (),
) -> Table:
    """A table whose ``no_wrap`` columns (ids) are never folded."""
    shown = Table(title=title, title_justify="left", header_style="bold")
    for name in columns:
        # A narrow terminal folds the wider columns; none shrinks below its header.
        shown.add_column(name, no_wrap=name in no_wrap, overflow="fold", min_width=len(name))
    for row in rows:
        shown.add_row(*("" if cell is None else str(cell) for cell in row))
    return shown


def print_listing(
    rows: Sequence[T],
    *,
    as_json: bool,
    wire: Callable[[T], Any],
    empty: str,
    columns: Sequence[str],
    cells: Callable[[T], Sequence[Any]],
    no_wrap: Sequence[str] = (),
) -> None:
    """Print what an ``ls`` command found: ``{"items": [...]}`` of each row's ``wire`` shape
    with ``--json``, else a table of each row's ``cells``, or the ``empty`` note on standard
    error when nothing matched."""
    if as_json:
        emit_json({"items": [wire(row) for row in rows]})
    elif not rows:
        click.echo(empty, err=True)
    else:
        console().print(table(None, columns, (cells(row) for row in rows), no_wrap=no_wrap))


def fields(pairs: Mapping[str, Any]) -> Table:
    """A two-column table of labels and values (a record shown on its own)."""
    shown = Table(show_header=False, box=None, pad_edge=False)
    shown.add_column(style="bold", no_wrap=True)
    shown.add_column(overflow="fold")
    for label, value in pairs.items():
        if value is not None and value != "":
            shown.add_row(label, str(value))
    return shown
