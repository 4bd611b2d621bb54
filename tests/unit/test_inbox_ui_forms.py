"""The inbox UI's pure parts: decision forms from JSON schemas, signed session cookies, the CSV
cells and the redirect targets it accepts."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import replace
from enum import StrEnum
from typing import Any

import pytest
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from engine.remote.auth import BearerTokenAuth, Principal, UnauthenticatedError
from engine.remote.ui.forms import build_form
from engine.remote.ui.history_pages import csv_cell
from engine.remote.ui.kit import UiSettings, safe_next
from engine.remote.ui.sessions import COOKIE_NAME, SessionCookies, exchange_token
from examples.banking import ApprovalDecision
from stores.settings import read_settings


class Risk(StrEnum):
    low = "low"
    high = "high"


class Nested(BaseModel):
    note: str


class Review(BaseModel):
    approved: bool
    limit: float = Field(ge=0, le=1000, description="Largest amount allowed")
    copies: int = 1
    risk: Risk = Risk.low
    comment: str | None = None
    extra: Nested | None = None


def test_the_banking_answer_is_a_required_yes_no_and_an_optional_feedback_box() -> None:
    form = build_form(ApprovalDecision.model_json_schema())
    approved, feedback = form.fields
    assert (approved.name, approved.kind, approved.required) == ("approved", "boolean", True)
    assert [c.label for c in approved.choices] == ["Yes", "No"]
    assert (feedback.kind, feedback.required, feedback.nullable) == ("textarea", False, True)

    read = form.read({"field.approved": "true", "field.feedback": "ok"})
    assert read.ok and read.answer == {"approved": True, "feedback": "ok"}
    read = form.read({"field.approved": "false", "field.feedback": ""})
    assert read.ok and read.answer == {"approved": False, "feedback": None}


def test_each_schema_type_gets_its_input_and_its_checks() -> None:
    form = build_form(Review.model_json_schema())
    kinds = {f.name: f.kind for f in form.fields}
    assert kinds == {
        "approved": "boolean",
        "limit": "number",
        "copies": "integer",
        "risk": "choice",
        "comment": "textarea",
        "extra": "json",
    }
    limit = next(f for f in form.fields if f.name == "limit")
    assert (limit.minimum, limit.maximum, limit.description) == (0, 1000, "Largest amount allowed")
    risk = next(f for f in form.fields if f.name == "risk")
    assert [c.value for c in risk.choices] == ['"low"', '"high"'] and risk.value == '"low"'

    good: dict[str, str] = {
        "field.approved": "true",
        "field.limit": "250.5",
        "field.copies": "2",
        "field.risk": '"high"',
        "field.extra": '{"note": "x"}',
    }
    read = form.read(good)
    assert read.ok
    assert read.answer == {
        "approved": True,
        "limit": 250.5,
        "copies": 2,
        "risk": "high",
        "comment": None,
        "extra": {"note": "x"},
    }


@pytest.mark.parametrize(
    ("field", "text", "problem"),
    [
        ("approved", "", "Choose an answer."),
        ("approved", "maybe", "Choose one of the options."),
        ("limit", "lots", "Enter a number."),
        ("limit", "5000", "Enter 1000 or less."),
        ("limit", "-1", "Enter 0 or more."),
        ("limit", "nan", "Enter a finite number."),
        ("copies", "1.5", "Enter a whole number."),
        ("risk", '"medium"', "Choose one of the options."),
        ("extra", "{nope", "This is not valid JSON"),
    ],
)
def test_a_problem_is_reported_on_its_field_and_nothing_is_answered(
    field: str, text: str, problem: str
) -> None:
    form = build_form(Review.model_json_schema())
    submitted = {"field.approved": "true", "field.limit": "1", "field.copies": "1"}
    submitted[f"field.{field}"] = text
    read = form.read(submitted)
    assert not read.ok and read.answer is None
    marked = {f.name: f for f in read.form.fields}
    error = marked[field].error
    assert error is not None and error.startswith(problem)
    assert marked[field].value == text, "the page shows what was typed"
    assert [message for _id, message in read.form.problems] == [f"{marked[field].label}: {error}"]


def test_a_schema_that_is_no_object_or_none_is_one_field() -> None:
    any_json = build_form(None)
    assert any_json.root and [f.kind for f in any_json.fields] == ["json"]
    assert any_json.read({"field.answer": "[1, 2]"}).answer == [1, 2]
    flag = build_form({"type": "boolean"})
    assert flag.root and flag.read({"field.answer": "false"}).answer is False
    choice = build_form({"enum": ["a", "b"]})
    assert choice.read({"field.answer": '"b"'}).answer == "b"


def test_a_nested_ref_with_null_becomes_its_inner_type() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "$defs": {"Amount": {"type": "integer", "minimum": 1}},
        "properties": {"amount": {"anyOf": [{"$ref": "#/$defs/Amount"}, {"type": "null"}]}},
        "required": ["amount"],
    }
    [amount] = build_form(schema).fields
    assert (amount.kind, amount.nullable, amount.minimum) == ("integer", True, 1)
    assert build_form(schema).read({"field.amount": ""}).answer == {"amount": None}


def _request(cookie: str | None = None, headers: dict[str, str] | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if cookie is not None:
        raw.append((b"cookie", f"{COOKIE_NAME}={cookie}".encode()))
    scope = {"type": "http", "method": "GET", "path": "/ui", "headers": raw, "scheme": "http"}
    return Request(scope)


def _cookie_of(response: Response) -> str:
    header = response.headers["set-cookie"]
    assert "HttpOnly" in header and "SameSite=strict" in header and "Path=/ui" in header
    return header.split(";")[0].split("=", 1)[1]


def test_a_session_cookie_round_trips_and_refuses_tampering() -> None:
    """An anonymous cookie reads back with its CSRF token; a tampered or foreign one does not."""
    cookies = SessionCookies("s" * 32)
    session = cookies.new()
    response = Response()
    cookies.write(response, session, _request())
    value = _cookie_of(response)

    read = cookies.read(_request(value))
    assert read is not None and read.principal is None and read.id is None
    assert read.csrf == session.csrf and read.csrf_matches(session.csrf)
    assert not read.csrf_matches("forged") and not read.csrf_matches(None)

    version, payload, signature = value.split(".")
    tampered = f"{version}.{payload[:-2]}AA.{signature}"
    assert cookies.read(_request(tampered)) is None
    assert SessionCookies("t" * 32).read(_request(value)) is None, "another secret"
    assert cookies.read(_request("garbage")) is None


def test_a_signed_in_cookie_carries_only_the_session_id() -> None:
    """A signed-in session's cookie names its row, nothing else, and only when signed."""
    cookies = SessionCookies("s" * 32)
    session = replace(cookies.new(), principal_id="bob", id="row-1")
    response = Response()
    cookies.write(response, session, _request())
    value = _cookie_of(response)
    payload = value.split(".")[1]
    assert json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))) == {
        "s": "row-1"
    }
    assert cookies.session_id(_request(value)) == "row-1"
    assert cookies.read(_request(value)) is None, "not an anonymous session"
    assert SessionCookies("t" * 32).session_id(_request(value)) is None, "another secret"


def test_an_expired_session_is_no_session() -> None:
    """An anonymous cookie past its end is ignored."""
    cookies = SessionCookies("s" * 32, session_seconds=60)
    session = cookies.new()
    old = replace(session, expires=int(time.time()) - 1)
    response = Response()
    cookies.write(response, old, _request())
    assert cookies.read(_request(_cookie_of(response))) is None


def test_secrets_are_checked_and_made_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short secret is refused; none given makes one for this process, whatever the
    environment holds; the settings hand TURNSTILE_UI_SECRET and the polling interval over."""
    with pytest.raises(ValueError, match="at least 32 bytes"):
        SessionCookies("short")
    monkeypatch.setenv("TURNSTILE_UI_SECRET", "x" * 40)
    monkeypatch.setenv("TURNSTILE_UI_POLL_SECONDS", "7")
    assert SessionCookies().ephemeral
    ui = read_settings().ui_settings()
    assert not SessionCookies(ui.secret).ephemeral
    assert ui.poll_interval() == 7.0
    assert UiSettings().poll_interval() == 3.0


async def test_a_token_is_exchanged_through_the_authenticator() -> None:
    auth = BearerTokenAuth({"good-token": Principal(id="bob")})
    assert (await exchange_token(auth, _request(), "good-token")).id == "bob"
    with pytest.raises(UnauthenticatedError):
        await exchange_token(auth, _request(), "bad-token")
    with pytest.raises(UnauthenticatedError):
        await exchange_token(auth, _request(), "caf\u00e9")
    # An empty token lets the authenticator read the request as it came.
    as_sent = _request(headers={"Authorization": "Bearer good-token"})
    assert (await exchange_token(auth, as_sent, "")).id == "bob"


@pytest.mark.parametrize(
    ("target", "safe"),
    [
        ("/ui/history?agent=x", "/ui/history?agent=x"),
        (None, "/ui"),
        ("https://evil.example/ui", "/ui"),
        ("//evil.example/ui", "/ui"),
        ("/api/bankingAgent", "/ui"),
        ("/ui\r\nSet-Cookie: x", "/ui"),
    ],
)
def test_only_ui_paths_are_redirect_targets(target: str | None, safe: str) -> None:
    assert safe_next(target) == safe


def test_csv_cells_cannot_be_formulas() -> None:
    assert [csv_cell(v) for v in ("=1+1", "+x", "-2", "@a", "plain", None, 3)] == [
        "'=1+1",
        "'+x",
        "'-2",
        "'@a",
        "plain",
        "",
        "3",
    ]
