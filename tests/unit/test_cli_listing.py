"""How an operator's listing reads: what a call asks in words, ids never cut, and the
summary folding before anything else gives way (workers/cli/output.py)."""

from __future__ import annotations

import io

from rich.console import Console

from workers.cli.output import Column, _listing, fields, in_words

ROWS = [
    ("748c8e91-a:approval-1", "userApproval: Transfer $1234567 to alice", "bankingAgent", ""),
    ("29a81c31:approval-1", "transferMoney amount=40 toAccount=carol", "bankingAgent", ""),
]
COLUMNS: list[Column[tuple[str, str, str, str]]] = [
    Column("ID", lambda r: r[0], is_id=True),
    Column("ASKED", lambda r: r[1], folds=True),
    Column("AGENT", lambda r: r[2]),
    Column("GROUP", lambda r: r[3]),
]


def _render(width: int, *, drop_empty: bool = True) -> list[str]:
    out = Console(file=io.StringIO(), width=width, color_system=None)
    out.print(_listing(COLUMNS, ROWS, drop_empty=drop_empty, width=width))
    text = out.file.getvalue()  # type: ignore[attr-defined]
    return [line.rstrip() for line in text.splitlines()]


def test_a_call_in_words_prefers_the_details_written_for_the_approver() -> None:
    """The ``details`` text when there is one, else each argument as key=value, uncut."""
    asked = {"action": "transferMoney", "details": "Transfer  $40\nto carol"}
    assert in_words("userApproval", asked) == "userApproval: Transfer $40 to carol"
    arguments = {"amount": 1234567.5, "toAccount": "carol", "memo": "rent for May"}
    assert (
        in_words("transferMoney", arguments)
        == 'transferMoney amount=1234567.5 toAccount=carol memo="rent for May"'
    )
    assert in_words("confirm", None) == "confirm"
    assert in_words("confirm", "go ahead") == 'confirm "go ahead"'


def test_a_narrow_listing_folds_the_summary_and_keeps_ids_whole() -> None:
    """At 64 columns the ids stay on one line, whole, and the summary folds; a column empty
    in every row is left out."""
    lines = _render(64)
    assert all(len(line) <= 64 for line in lines)
    assert lines[0].split() == ["ID", "ASKED", "AGENT"]
    text = "\n".join(lines)
    assert "748c8e91-a:approval-1" in text and "29a81c31:approval-1" in text
    assert "$1234567" in text


def test_a_very_narrow_listing_leaves_out_other_columns_before_the_summary() -> None:
    """When the ids and the other columns leave the summary no room, the other columns go."""
    lines = _render(44)
    assert lines[0].split() == ["ID", "ASKED"]
    assert all(len(line) <= 44 for line in lines)
    assert "748c8e91-a:approval-1" in lines[1]


def test_wide_keeps_every_column() -> None:
    """Without dropping, the empty column stays."""
    assert _render(200, drop_empty=False)[0].split() == ["ID", "ASKED", "AGENT", "GROUP"]


def test_cells_are_text_not_markup() -> None:
    """What a model or an app wrote — square brackets included — prints as written in a
    listing and in a record, instead of being read as (possibly broken) markup."""
    asked = "[/oops] [bold]Transfer[/bold] $5"
    out = Console(file=io.StringIO(), width=100, color_system=None)
    out.print(
        _listing(COLUMNS, [("a:approval-1", asked, "bankingAgent", "")], drop_empty=True, width=100)
    )
    out.print(fields({"asks": asked}))
    text = out.file.getvalue()  # type: ignore[attr-defined]
    assert text.count(asked) == 2
