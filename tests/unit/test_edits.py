"""The pure rules of edit before approve (engine/approvals/edits.py): merging and validating
an edit, its diff, which tools may be edited, and the edited call's idempotency key."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from engine.approvals.edits import diff_of, make_edit
from engine.errors import FailedPreconditionError, InvalidArgumentError
from engine.tools import InterruptTool, Tool
from engine.turns.resume import edited_key


class Transfer(BaseModel):
    amount: float
    toAccount: str
    memo: str | None = None


def transfer_tool(*, editable: bool = True) -> Tool:
    return Tool(name="transferMoney", input_schema=Transfer, fn=lambda _: None, editable=editable)


ORIGINAL = {"amount": 40, "toAccount": "carol", "memo": "rent"}


def test_edit_merges_fields_and_records_a_diff() -> None:
    """Given fields replace the call's, null removes one, the rest stay; the diff lists each
    changed field with its old and new value, and who edited."""
    edit = make_edit(
        transfer_tool(), "transferMoney", ORIGINAL, {"amount": 500, "memo": None}, by="bob"
    )
    assert edit["input"] == {"amount": 500, "toAccount": "carol"}
    assert edit["diff"] == [
        {"field": "amount", "old": 40, "new": 500},
        {"field": "memo", "old": "rent"},
    ]
    assert edit["by"] == "bob" and edit["at"]


def test_diff_names_added_fields_without_an_old_value() -> None:
    """A field the original lacked has only a new value."""
    assert diff_of({"a": 1}, {"a": 1, "b": 2}) == [{"field": "b", "new": 2}]


@pytest.mark.parametrize(
    "changes",
    [
        {"amount": "500"},
        {"amount": None},
        {},
        ["amount", 500],
        {"amount": 40},
        {"amount": 50, "fee": 1},
        {"amount": float("inf")},
        {"amount": float("nan")},
    ],
    ids=[
        "string-for-number",
        "required-removed",
        "empty",
        "not-an-object",
        "no-change",
        "undeclared-field",
        "infinite",
        "not-a-number",
    ],
)
def test_bad_edits_are_invalid_arguments(changes: object) -> None:
    """Strict schema check (no coercion of "500"), required fields, fields the schema does not
    declare, numbers JSON cannot hold, and edits that are empty, not an object or change
    nothing are refused."""
    with pytest.raises(InvalidArgumentError):
        make_edit(transfer_tool(), "transferMoney", ORIGINAL, changes, by="bob")


def test_a_tool_without_a_schema_may_change_only_the_fields_its_call_has() -> None:
    """With no input schema to declare fields, an edit may not add one."""
    loose = Tool(name="note", fn=lambda _: None, editable=True)
    assert make_edit(loose, "note", {"text": "a"}, {"text": "b"}, by="bob")["input"] == {
        "text": "b"
    }
    with pytest.raises(InvalidArgumentError):
        make_edit(loose, "note", {"text": "a"}, {"other": 1}, by="bob")


def test_only_editable_tools_may_be_edited() -> None:
    """A tool without editable=True, an interrupt, or an unknown tool refuse any edit."""
    interrupt = InterruptTool(name="userApproval", input_schema=Transfer)
    for tool in (transfer_tool(editable=False), interrupt, None):
        with pytest.raises(FailedPreconditionError, match="not editable"):
            make_edit(tool, "transferMoney", ORIGINAL, {"amount": 500}, by="bob")


def test_edited_key_covers_the_arguments() -> None:
    """The same edited arguments give the same key (a retry repeats it), others another,
    and none equals the original key; key order in the arguments does not matter."""
    key = edited_key("t1:transfer-1", {"amount": 500, "toAccount": "carol"})
    assert key == edited_key("t1:transfer-1", {"toAccount": "carol", "amount": 500})
    assert key != edited_key("t1:transfer-1", {"amount": 600, "toAccount": "carol"})
    assert key.startswith("t1:transfer-1:edited-") and key != "t1:transfer-1"
