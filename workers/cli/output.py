"""How the operator commands print: ``rich`` tables for people, JSON for scripts.

Tables go to standard output; progress bars and notes to standard error, so that standard
output holds only the answer. Without a terminal (a pipe, a file) tables are plain text,
without colour, each as wide as its content (or ``COLUMNS``, when set): nothing is folded
for a script or a log to piece together.

A listing (``turns ls``, ``approvals ls``) shows a few columns, led by the row's summary,
and fits the terminal: ids are printed whole on one line, and the summary folds instead.
``--wide`` shows every column, each line as long as it needs.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from engine.conversation.parts import Message, Part

__all__ = [
    "Column",
    "ago",
    "console",
    "emit_json",
    "in_words",
    "iso",
    "message_text",
    "part_text",
    "print_columns",
    "print_listing",
    "print_rows",
    "short",
    "stderr_console",
    "table",
]

T = TypeVar("T")

#: The width of the page for a pipe or a file when ``COLUMNS`` is unset: tables are only as
#: wide as their content, so this is "unbounded".
PIPE_WIDTH = 10_000
#: Spaces between two columns of a listing.
COLUMN_GAP = 2
#: The width a listing keeps for its summary before it leaves other columns out.
FOLDED_WIDTH = 24


def _width(stream: Any) -> int | None:
    if stream.isatty() or os.environ.get("COLUMNS"):
        return None  # rich reads the terminal's width, or COLUMNS
    return PIPE_WIDTH


def console(*, unbounded: bool = False) -> Console:
    """The console of standard output (``unbounded``: as wide as what it prints, even on a
    terminal, which then wraps the long lines itself)."""
    width = PIPE_WIDTH if unbounded else _width(sys.stdout)
    return Console(width=width, highlight=False, soft_wrap=False)


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


def short(value: Any, width: int | None = 60) -> str:
    """``value`` on one line (JSON unless it is text), cut to ``width`` characters
    (``None``: whole)."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _word(value: Any) -> str:
    """One argument's value: text as it is (quoted when it holds spaces), else JSON."""
    if isinstance(value, str) and value and not any(c.isspace() for c in value):
        return value
    return json.dumps(value, ensure_ascii=False)


def in_words(name: str, value: Any) -> str:
    """A call of ``name`` with ``value`` in words, uncut: ``name: <details>`` when the value
    carries a ``details`` text (written for the approver), else ``name key=value …``."""
    if isinstance(value, dict):
        details = value.get("details")
        if isinstance(details, str) and details.strip():
            return f"{name}: {' '.join(details.split())}"
        arguments = " ".join(f"{key}={_word(item)}" for key, item in value.items())
        return f"{name} {arguments}".strip()
    if value is None:
        return name
    return f"{name} {' '.join(_word(value).split())}"


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
        shown.add_row(*(Text("" if cell is None else str(cell)) for cell in row))
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


@dataclass(frozen=True)
class Column(Generic[T]):
    """One column of a listing: its header, and its cell for a row."""

    header: str
    cell: Callable[[T], Any]
    #: An id: printed whole on one line, never folded or cut.
    is_id: bool = False
    #: The row's summary: the column that folds when the terminal is narrow (the others
    #: keep to one line while they can).
    folds: bool = False


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _listing(
    columns: Sequence[Column[T]],
    rows: Sequence[T],
    *,
    drop_empty: bool,
    width: int,
    title: str | None = None,
) -> Table:
    """The listing's table: no frame, two spaces between columns; each id column as wide as
    its longest id, and only the summary folding. When even that is wider than ``width``,
    the last columns that are neither an id nor the summary are left out."""
    cells = [[_text(column.cell(row)) for column in columns] for row in rows]
    kept = [
        index
        for index in range(len(columns))
        if not drop_empty or columns[index].is_id or any(line[index] for line in cells)
    ]

    def needs(index: int) -> int:
        longest = max([len(columns[index].header)] + [len(line[index]) for line in cells])
        return min(longest, FOLDED_WIDTH) if columns[index].folds else longest

    optional = [index for index in kept if not (columns[index].is_id or columns[index].folds)]
    while optional and sum(map(needs, kept)) + COLUMN_GAP * (len(kept) - 1) > width:
        kept.remove(optional.pop())
    shown = Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=None,
        pad_edge=False,
        padding=(0, COLUMN_GAP // 2),
        header_style="bold",
    )
    for index in kept:
        column = columns[index]
        shown.add_column(
            column.header,
            no_wrap=not column.folds,
            overflow="fold",
            min_width=needs(index) if column.is_id else len(column.header),
        )
    for line in cells:
        # Cells are text, not markup: what a model or an app wrote shows as written.
        shown.add_row(*(Text(line[index]) for index in kept))
    return shown


def print_columns(
    rows: Sequence[T],
    *,
    as_json: bool,
    wide: bool,
    wire: Callable[[T], Any],
    empty: str,
    columns: Sequence[Column[T]],
    wide_columns: Sequence[Column[T]],
) -> None:
    """Print what an ``ls`` command found: ``{"items": [...]}`` of each row's ``wire`` shape
    with ``--json``; else a table of ``columns`` (those empty in every row left out) that
    fits the terminal or, with ``--wide``, of every one of ``wide_columns``, nothing folded
    (the terminal wraps its long lines); or the ``empty`` note on standard error when nothing
    matched."""
    if as_json:
        emit_json({"items": [wire(row) for row in rows]})
    elif not rows:
        click.echo(empty, err=True)
    else:
        print_rows(rows, wide=wide, columns=columns, wide_columns=wide_columns)


def print_rows(
    rows: Sequence[T],
    *,
    wide: bool,
    columns: Sequence[Column[T]],
    wide_columns: Sequence[Column[T]],
    title: str | None = None,
) -> None:
    """Print ``rows`` as a listing prints them (a part of a larger answer, under its
    ``title``): ``columns`` that fit the terminal, those empty in every row left out, or
    with ``wide`` every one of ``wide_columns``, nothing folded."""
    out = console(unbounded=wide)
    chosen = wide_columns if wide else columns
    out.print(_listing(chosen, rows, drop_empty=not wide, width=out.width, title=title))


def fields(pairs: Mapping[str, Any]) -> Table:
    """A two-column table of labels and values (a record shown on its own)."""
    shown = Table(show_header=False, box=None, pad_edge=False)
    shown.add_column(style="bold", no_wrap=True)
    shown.add_column(overflow="fold")
    for label, value in pairs.items():
        if value is not None and value != "":
            shown.add_row(label, Text(str(value)))
    return shown
