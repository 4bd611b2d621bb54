"""Database URLs as Turnstile prints them: every secret replaced by ``***`` (issue 31, item 3)."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from stores.database import redact


@pytest.mark.parametrize(
    ("url", "printed"),
    [
        ("postgresql+psycopg://u:s3cr%40t@h:5432/db", "postgresql+psycopg://u:***@h:5432/db"),
        ("postgresql://u:p@ss@h:5432/db", "postgresql://u:***@h:5432/db"),
        (
            "postgresql://u@h/db?password=s3cret&sslmode=require",
            "postgresql://u@h/db?password=***&sslmode=require",
        ),
        ("postgresql://h/db?SSLPassword=k3y", "postgresql://h/db?SSLPassword=***"),
    ],
)
def test_secrets_are_hidden_wherever_the_url_carries_them(url: str, printed: str) -> None:
    """The userinfo password (a raw ``@`` in it too) and secret query parameters are masked."""
    assert redact(url) == printed


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///.turnstile/turnstile.db",
        "sqlite:////tmp/a@b/turnstile.db",
        "postgresql://u@h:5432/db?sslmode=require&application_name=a",
    ],
)
def test_a_url_without_secrets_prints_as_written(url: str) -> None:
    """Nothing but secrets is changed: paths, users and other parameters stay readable."""
    assert redact(url) == url


def test_a_parsed_url_is_redacted_like_its_text() -> None:
    """A SQLAlchemy ``URL`` (a store's own) hides its password and query secrets alike."""
    assert redact(make_url("postgresql://u:pw@h/db?password=x")) == (
        "postgresql://u:***@h/db?password=***"
    )
