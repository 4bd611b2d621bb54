"""One client cannot fill a real ``turnstile serve``: sign-ins and the web UI's event streams
have budgets of their own, each client address holds at most its share of the request
slots, and ``/readyz`` says when every slot is busy.

Clients come from distinct loopback addresses (127.0.0.2, 127.0.0.3, …), which Linux routes
to the server like any other: to the server they are distinct clients.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time

import httpx
import pytest

from tests.acceptance.inbox_ui_auth import TOKENS
from tests.acceptance.inbox_ui_support import AUTH_SPEC
from tests.databases import postgres_url
from tests.http_support import closing_all, serve_process

pytestmark = pytest.mark.postgres

UI_SECRET = {"TURNSTILE_UI_SECRET": "budgets-acceptance-secret-0123456789abcdef"}
#: A request body the stalled requests below announce and never finish sending.
STALLED_LENGTH = 1000


def stalled_request(base: str, path: str, source: str) -> socket.socket:
    """A connection from ``source`` that sends a POST head for ``path`` and ten bytes of its
    body (a form for the sign-in page, JSON elsewhere), then stalls: the server holds a slot
    for it while it waits for the rest."""
    host, port = base.removeprefix("http://").split(":")
    form = "application/x-www-form-urlencoded"
    sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: {form if path == '/ui/login' else 'application/json'}\r\n"
        f"Content-Length: {STALLED_LENGTH}\r\n\r\n"
    )
    sock.sendall(head.encode() + b"token=abcd")
    return sock


def answer_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent on ``sock`` within ``seconds`` (``b""``: nothing yet)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(65536)
    except TimeoutError:
        return b""


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer else 0


def client_from(base: str, source: str) -> httpx.Client:
    """An HTTP client whose connections come from the loopback address ``source``."""
    transport = httpx.HTTPTransport(local_address=source)
    return httpx.Client(base_url=base, timeout=30, transport=transport)


def snapshot_status(client: httpx.Client) -> int:
    """The status of an ordinary API request (a snapshot that does not exist)."""
    return client.post("/api/-/getSnapshot", json={"snapshotId": "none"}).status_code


def signed_in(base: str, who: str) -> httpx.Client:
    """A client holding a fresh browser session of ``who``."""
    client = httpx.Client(base_url=base, timeout=30)
    form = client.get("/ui/login")
    found = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert found is not None, form.text
    answer = client.post("/ui/login", data={"csrf_token": found.group(1), "token": TOKENS[who]})
    assert answer.status_code == 303, answer.text
    return client


def test_stalled_sign_ins_take_only_the_sign_in_budget() -> None:
    """Forty sign-ins from forty addresses whose bodies never finish hold at most sixteen
    sign-in slots (the rest get 503, and a fifth from one address 429); ordinary requests
    are served meanwhile even with eight request slots, and the stalled ones get 408 at the
    five-second sign-in deadline, after which sign-in works again."""
    args = ["--auth", AUTH_SPEC, "--limit-concurrency", "8", "--limit-connections", "100"]
    with postgres_url() as url, serve_process(url, args=args, env=UI_SECRET) as (base, _p):
        with client_from(base, "127.0.0.1") as ordinary:
            normal = snapshot_status(ordinary)
            assert normal not in (429, 503)
            sources = [f"127.0.1.{n}" for n in range(1, 41)]
            with closing_all([stalled_request(base, "/ui/login", s) for s in sources]) as held:
                started = time.monotonic()
                answers = [answer_within(sock, 0.2) for sock in held]
                statuses = [status_of(answer) for answer in answers]
                assert statuses.count(0) == 16, statuses
                assert set(statuses) == {0, 503}, statuses
                assert b"retry-after: 1" in answers[statuses.index(503)].lower()
                for _ in range(5):
                    assert snapshot_status(ordinary) == normal
                with client_from(base, "127.0.1.1") as same_address:
                    assert same_address.get("/ui/login").status_code == 503
                late = [
                    answer_within(sock, 10)
                    for sock, s in zip(held, statuses, strict=True)
                    if s == 0
                ]
                assert {status_of(answer) for answer in late} == {408}
                assert time.monotonic() - started < 8
        with closing_all(
            [stalled_request(base, "/ui/login", "127.0.2.1") for _ in range(5)]
        ) as one:
            statuses = [status_of(answer_within(sock, 0.2)) for sock in one]
            assert sorted(statuses) == [0, 0, 0, 0, 429], statuses
        with contextlib.closing(signed_in(base, "bob")) as bob:
            assert bob.get("/ui").status_code == 200


def test_one_client_address_holds_at_most_its_share_of_request_slots() -> None:
    """With eight request slots a client address may hold two: its third request gets 429
    while another address is served; once four addresses hold all eight, the next request
    gets 503 and /readyz says the server is saturated (503, naming the slots) while /healthz
    answers; when they finish, /readyz is ready again."""
    args = ["--limit-concurrency", "8", "--limit-connections", "100"]
    with postgres_url() as url, serve_process(url, args=args) as (base, _p):
        with client_from(base, "127.0.3.9") as other:
            normal = snapshot_status(other)
        with closing_all(
            [stalled_request(base, "/api/bankingAgent", "127.0.3.1") for _ in range(2)]
        ) as first:
            assert [answer_within(sock, 0.3) for sock in first] == [b"", b""]
            with client_from(base, "127.0.3.1") as greedy:
                refused = greedy.post("/api/-/getSnapshot", json={"snapshotId": "none"})
                assert refused.status_code == 429, refused.text
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["status"] == "RESOURCE_EXHAUSTED"
            with client_from(base, "127.0.3.9") as other:
                assert snapshot_status(other) == normal
            rest = [
                stalled_request(base, "/api/bankingAgent", f"127.0.3.{n}")
                for n in (2, 2, 3, 3, 4, 4)
            ]
            with closing_all(rest):
                assert [answer_within(sock, 0.3) for sock in rest] == [b""] * 6
                with client_from(base, "127.0.3.9") as other:
                    assert snapshot_status(other) == 503
                ready = httpx.get(f"{base}/readyz", timeout=10)
                assert ready.status_code == 503, ready.text
                assert "all 8 request slots are busy" in ready.json()["reason"]
                assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        ready = eventually_ready(base)
        assert ready.json()["checks"]["requests"].startswith("0 of 8 request slots busy")


def eventually_ready(base: str) -> httpx.Response:
    """``/readyz`` once it answers 200 (the server notices closed connections promptly)."""
    deadline = time.monotonic() + 5
    while True:
        ready = httpx.get(f"{base}/readyz", timeout=10)
        if ready.status_code == 200 or time.monotonic() > deadline:
            assert ready.status_code == 200, ready.text
            return ready
        time.sleep(0.1)


def open_stream(client: httpx.Client, stack: contextlib.ExitStack) -> httpx.Response:
    """``GET /ui/events`` held open on ``stack`` (its head read; the body left streaming)."""
    return stack.enter_context(client.stream("GET", "/ui/events"))


def test_event_streams_are_capped_per_session_and_principal_outside_the_request_slots() -> None:
    """A browser session may hold four event streams and a principal sixteen; the next get
    429 (the page then polls). Held streams take none of the two request slots: the JSON
    inbox still answers."""
    args = ["--auth", AUTH_SPEC, "--limit-concurrency", "2", "--limit-streams", "80"]
    with (
        postgres_url() as url,
        serve_process(url, args=args, env=UI_SECRET) as (base, _p),
        contextlib.ExitStack() as stack,
    ):
        sessions = [
            stack.enter_context(contextlib.closing(signed_in(base, "bob"))) for _ in range(5)
        ]
        first = sessions[0]
        streams = [open_stream(first, stack) for _ in range(4)]
        assert [stream.status_code for stream in streams] == [200] * 4
        refused = first.get("/ui/events")
        assert refused.status_code == 429
        inbox = httpx.get(
            f"{base}/inbox", headers={"authorization": f"Bearer {TOKENS['bob']}"}, timeout=30
        )
        assert inbox.status_code == 200, inbox.text
        for session in sessions[1:4]:
            assert [open_stream(session, stack).status_code for _ in range(4)] == [200] * 4
        assert sessions[4].get("/ui/events").status_code == 429
        with (
            contextlib.closing(signed_in(base, "alice")) as alice,
            alice.stream("GET", "/ui/events") as own,
        ):
            assert own.status_code == 200
