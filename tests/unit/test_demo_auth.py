"""The README's demo authenticator: named tokens for a local inbox, refused without ``--dev``."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from engine.remote.auth import BearerTokenAuth, Principal, is_demo_only
from examples import demo_auth
from workers.cli.startup import Refused, check_auth

ROOT = Path(__file__).resolve().parents[2]
SPEC = "examples.demo_auth:auth"


def test_serve_refuses_the_demo_authenticator_without_dev(tmp_path: Path) -> None:
    """``turnstile serve --auth examples.demo_auth:auth`` without ``--dev`` stops at once with
    one line naming --dev and exit 2, before it touches the database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env["TURNSTILE_STATE_KEYS"] = f"k1:{secrets.token_urlsafe(32)}"  # not the published key
    database = tmp_path / "never-opened.db"
    command = ["serve", "--app", "examples.banking:ai", "--db", f"sqlite:///{database}"]
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", *command, "--auth", SPEC],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"turnstile serve: refusing to start: --auth {SPEC} is a demo")
    assert "--dev" in lines[0]
    assert not database.exists()


def test_dev_accepts_the_demo_authenticator_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``--dev`` the demo authenticator is served, and the log says its tokens are public."""
    with caplog.at_level(logging.WARNING, logger="turnstile.cli"):
        check_auth(demo_auth.auth, SPEC, dev=True)
    assert "tokens are published" in caplog.text


def test_only_an_authenticator_marked_demo_only_is_refused() -> None:
    """A deployment's own BearerTokenAuth (or any callable without the mark) passes the check."""
    own = BearerTokenAuth({secrets.token_urlsafe(32): "alice"})
    assert not is_demo_only(own)
    check_auth(own, "myapp.auth:auth", dev=False)
    with pytest.raises(Refused, match="--dev"):
        check_auth(demo_auth.auth, SPEC, dev=False)


async def test_the_demo_tokens_name_alice_bob_the_approver_and_carol() -> None:
    """Each documented token signs in its person; only Bob holds the approver role."""
    from starlette.requests import Request

    def request_with(token: str) -> Request:
        header = (b"authorization", f"Bearer {token}".encode())
        return Request({"type": "http", "headers": [header]})

    who = {
        name: await demo_auth.auth(request_with(token)) for name, token in demo_auth.TOKENS.items()
    }
    assert who == {
        "alice": Principal(id="alice"),
        "bob": Principal(id="bob", roles=frozenset({"approver"})),
        "carol": Principal(id="carol"),
    }
