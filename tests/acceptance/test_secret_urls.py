"""A database password never prints (issue 31, item 3): real ``turnstile`` processes given a
URL with a password in its user part and in its query string print and log it masked, and
one with a raw ``@`` in the password is refused without printing the password's tail.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url

from tests.databases import postgres_url
from tests.http_support import run_turnstile, serve_process

#: Text from the secrets this module puts in URLs (the local server trusts any password).
USER_PASSWORD = "hunter2-user"
QUERY_PASSWORD = "hunter2-query"


def with_passwords(url: str) -> tuple[str, list[str]]:
    """``url`` carrying a password twice over, and the secrets that must not print; a URL
    that already has a password (a ``DATABASE_URL`` of CI's) keeps its own."""
    parsed = make_url(url)
    if parsed.password:
        return url, [str(parsed.password)]
    secret = parsed.set(password=USER_PASSWORD).update_query_dict({"password": QUERY_PASSWORD})
    return secret.render_as_string(hide_password=False), [USER_PASSWORD, QUERY_PASSWORD]


def test_migrate_and_serve_print_the_url_masked(tmp_path: Path) -> None:
    """``migrate`` echoes the database and ``serve`` logs it at start, both with every
    password replaced by ``***``."""
    with postgres_url() as plain:
        url, secrets = with_passwords(plain)
        migrated = run_turnstile("migrate", "--db", url, db_url=url)
        assert migrated.returncode == 0, migrated.stderr
        assert "***" in migrated.stdout, migrated.stdout
        log = tmp_path / "serve.log"
        with serve_process(url, args=["--log-level", "INFO"], log=log):
            pass
        logged = log.read_text()
        assert "***" in logged, logged
        for secret in secrets:
            assert secret not in migrated.stdout + migrated.stderr
            assert secret not in logged


def test_an_unreachable_database_is_named_without_its_password() -> None:
    """A worker that gives up on its database names it, masked, in warnings and its error."""
    url = f"postgresql://postgres:{USER_PASSWORD}@127.0.0.1:1/x?password={QUERY_PASSWORD}"
    failed = run_turnstile(
        "worker", "--app", "examples.banking:ai", "--db", url, "--connect-timeout", "1", db_url=url
    )
    assert failed.returncode == 1, failed.stderr
    assert "postgresql://postgres:***@127.0.0.1:1/x?password=***" in failed.stderr
    assert USER_PASSWORD not in failed.stderr + failed.stdout
    assert QUERY_PASSWORD not in failed.stderr + failed.stdout


def test_a_raw_at_sign_in_the_password_is_refused_without_its_tail() -> None:
    """``user:hunter@2-tail@host`` would read ``2-tail@host`` as the host and print it in
    the connection error; it is refused up front with the fix (``%40``), printing neither
    half of the password."""
    url = "postgresql://postgres:hunter@2-tail@127.0.0.1:5432/x"
    refused = run_turnstile("migrate", "--db", url, db_url=url)
    assert refused.returncode == 2, refused.stderr
    assert "percent-encode it as %40" in refused.stderr
    assert "hunter" not in refused.stderr and "2-tail" not in refused.stderr
