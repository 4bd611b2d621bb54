"""The web UI's event stream on a real ``turnstile serve`` (PostgreSQL, LISTEN/NOTIFY) tells a
principal only of the turns their pages may show: under the default policy, Bob's open
stream stays silent while Alice's transfer runs and pauses, and speaks for Bob's own."""

from __future__ import annotations

import queue
import re
import threading

import httpx
import pytest

from tests.acceptance.inbox_ui_auth import TOKENS
from tests.acceptance.inbox_ui_support import AUTH_SPEC, pause_transfer
from tests.databases import postgres_url
from tests.http_support import serve_process

pytestmark = pytest.mark.postgres

UI_SECRET = {"TURNSTILE_UI_SECRET": "scope-acceptance-secret-0123456789abcdef"}


def read_events(stream: httpx.Response, into: queue.Queue[str]) -> None:
    """Put the name of each event of ``stream`` into ``into`` until it ends."""
    try:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                into.put(line.removeprefix("event: "))
    except httpx.HTTPError:
        pass  # the test closed the stream


def quiet_for(events: queue.Queue[str], seconds: float) -> list[str]:
    """The events that came within ``seconds`` (none expected)."""
    heard = []
    try:
        while True:
            heard.append(events.get(timeout=seconds))
    except queue.Empty:
        return heard


def test_bobs_stream_is_silent_while_alice_acts_and_speaks_for_his_own_turn() -> None:
    """Alice's transfer (created, claimed, run, paused) sends Bob's stream nothing; Bob's
    own transfer sends it a change."""
    args = ["--auth", AUTH_SPEC]
    with (
        postgres_url() as url,
        serve_process(url, workers=1, args=args, env=UI_SECRET) as (base, _p),
        httpx.Client(base_url=base, timeout=30) as bob,
    ):
        form = bob.get("/ui/login")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert csrf is not None
        signed = bob.post("/ui/login", data={"csrf_token": csrf[1], "token": TOKENS["bob"]})
        assert signed.status_code == 303
        events: queue.Queue[str] = queue.Queue()
        with bob.stream("GET", "/ui/events", timeout=httpx.Timeout(30, read=None)) as stream:
            assert stream.status_code == 200
            threading.Thread(target=read_events, args=(stream, events), daemon=True).start()
            assert events.get(timeout=10) == "ready"
            quiet_for(events, 1.5)  # the listener's first connection announces everything
            pause_transfer(base, "alice")
            assert quiet_for(events, 2.0) == []
            pause_transfer(base, "bob")
            assert events.get(timeout=10) == "change"
