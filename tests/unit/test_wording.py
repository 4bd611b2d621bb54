"""How an approval is worded for the approver: a declared title and summary (a template over
the input or a function of it), falling back to the code name and the input's values."""

from __future__ import annotations

import logging

import pytest
from pydantic import BaseModel

from engine import Engine, ScriptedModel
from engine.approvals.wording import MAX_SUMMARY_CHARS, MAX_TITLE_CHARS, wording_of


class Transfer(BaseModel):
    amount: float
    toAccount: str


def engine() -> Engine:
    return Engine(model=ScriptedModel())


def test_a_template_fills_the_inputs_keys() -> None:
    """A summary template reads the input's keys, format specs included."""
    tool = engine().define_interrupt(
        name="transferApproval",
        input_schema=Transfer,
        title="Transfer approval",
        summary="Transfer ${amount:.2f} to {toAccount}",
    )
    said = wording_of(tool, tool.name, {"amount": 250, "toAccount": "rent"})
    assert (said.title, said.summary, said.declared) == (
        "Transfer approval",
        "Transfer $250.00 to rent",
        True,
    )


def test_a_key_the_input_lacks_stays_readable() -> None:
    """A template field the input does not carry is kept as written, not an error."""
    tool = engine().define_interrupt(name="ask", summary="Pay {amount:.2f} to {payee[name]}")
    said = wording_of(tool, tool.name, {"other": 1})
    assert said.summary == "Pay {amount:.2f} to {payee[name]}"
    assert said.declared


def test_a_function_gets_the_validated_input() -> None:
    """A summary function is called with the input parsed by the input schema."""
    tool = engine().define_interrupt(
        name="ask",
        input_schema=Transfer,
        summary=lambda t: f"Send {t.amount:g} to {t.toAccount.upper()}",
    )
    assert wording_of(tool, "ask", {"amount": 5, "toAccount": "bob"}).summary == "Send 5 to BOB"


def test_a_raising_function_falls_back_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    """A summary function that raises shows today's wording, and says so in the log once."""

    def broken(_value: object) -> str:
        raise RuntimeError("boom")

    tool = engine().define_interrupt(name="brokenSummary", title="Broken", summary=broken)
    with caplog.at_level(logging.WARNING, logger="engine.approvals.wording"):
        first = wording_of(tool, tool.name, {"details": "Transfer $1 to x"})
        wording_of(tool, tool.name, {"details": "again"})
    assert (first.title, first.summary, first.declared) == ("Broken", "Transfer $1 to x", False)
    assert [r.getMessage() for r in caplog.records if "brokenSummary" in r.getMessage()] == [
        "The summary declared on 'brokenSummary' could not be rendered (RuntimeError: boom); "
        "showing the default wording."
    ]


def test_a_template_that_cannot_be_filled_falls_back() -> None:
    """Attribute access on a plain value fails at render time: the default wording is shown."""
    tool = engine().define_interrupt(name="attr", summary="{amount.real.nope}")
    said = wording_of(tool, tool.name, {"amount": 3})
    assert (said.summary, said.declared) == ("3", False)


def test_a_function_returning_no_text_falls_back() -> None:
    """A summary function must return a string; anything else shows the default wording."""
    tool = engine().define_interrupt(name="notText", summary=lambda _v: 42)  # type: ignore[arg-type]
    assert not wording_of(tool, tool.name, {"a": "b"}).declared


def test_without_a_declaration_the_code_name_and_input_values_are_shown() -> None:
    """An undeclared interrupt, or one the app no longer defines, keeps today's wording."""
    tool = engine().define_interrupt(name="userApproval")
    value = {"action": "transferMoney", "details": "Transfer $9 to x"}
    expected = ("userApproval", "transferMoney — Transfer $9 to x", False)
    said = wording_of(tool, "userApproval", value)
    assert (said.title, said.summary, said.declared) == expected
    gone = wording_of(None, "userApproval", value)
    assert (gone.title, gone.summary, gone.declared) == expected


def test_the_wording_is_one_line_of_plain_text_cut_to_length() -> None:
    """Newlines and control characters become spaces and long text is cut; markup is left as
    text for the page to escape."""
    tool = engine().define_interrupt(name="t", title="T" * 500, summary="{note}")
    said = wording_of(tool, "t", {"note": "<script>alert(1)</script>\n\x1b[31m" + "x" * 10_000})
    assert said.summary.startswith("<script>alert(1)</script> [31m")
    assert len(said.summary) == MAX_SUMMARY_CHARS and said.summary.endswith("…")
    assert len(said.title) == MAX_TITLE_CHARS
    assert "\n" not in said.summary and "\x1b" not in said.summary


@pytest.mark.parametrize(
    ("title", "summary"),
    [("", None), (None, ""), (None, "{"), (None, "Pay {}"), (None, "Pay {0}"), (None, 42)],
)
def test_a_malformed_declaration_is_refused_at_definition(title: object, summary: object) -> None:
    """An empty title, an empty or broken template, positional fields or a non-callable
    summary are definition errors, not runtime surprises."""
    with pytest.raises(ValueError):
        engine().define_interrupt(name="bad", title=title, summary=summary)  # type: ignore[arg-type]


def test_a_tool_that_pauses_itself_is_worded_too() -> None:
    """``define_tool`` takes the same title and summary as ``define_interrupt``."""
    tool = engine().define_tool(
        name="refund",
        fn=lambda value: value,
        title="Refund",
        summary="Refund {amount} to {customer}",
    )
    said = wording_of(tool, "refund", {"amount": 12, "customer": "ann"})
    assert (said.title, said.summary) == ("Refund", "Refund 12 to ann")


def test_a_huge_value_is_cut_from_a_bounded_head() -> None:
    """Text that only whitespace fills for long still ends in an ellipsis when it is cut."""
    tool = engine().define_interrupt(name="spaces", summary="{note}")
    said = wording_of(tool, "spaces", {"note": "start" + " " * 100_000 + "end"})
    assert said.summary == "start…"
