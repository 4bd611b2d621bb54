"""Connection hardening of a real ``turnstile serve`` process, driven over raw TCP sockets.

Idle sockets that never send a byte, heads sent a line at a time, bodies that stall, more
requests than the server serves at once, and floods of invalid requests: the server keeps
answering ``/healthz`` promptly, closes what overstays its limits, and logs floods at a
bounded rate.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import httpx

from tests.databases import postgres_url
from tests.http_support import closing_all, serve_process

#: How long /healthz may take while the server is flooded (generous for a loaded CI machine).
PROMPT = 2.0


def open_idle_sockets(base: str, count: int) -> list[socket.socket]:
    """``count`` TCP connections to the server that send nothing."""
    host, port = base.removeprefix("http://").split(":")
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.setblocking(False)
        sockets.append(sock)
    return sockets


def is_closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (it never sent anything, so any read is EOF)."""
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def timed_healthz(base: str) -> float:
    started = time.monotonic()
    response = httpx.get(f"{base}/healthz", timeout=10)
    assert response.status_code == 200
    return time.monotonic() - started


def raw_connection(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def wait_closed(sock: socket.socket, timeout: float) -> float:
    """Seconds until the server closes ``sock`` (whatever it sends first is read and kept)."""
    started = time.monotonic()
    sock.settimeout(timeout)
    while True:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - started


def count_lines(log: Path, text: str) -> int:
    return sum(text in line for line in log.read_text(errors="replace").splitlines())


def test_healthz_answers_while_hundreds_of_idle_sockets_sit_open(tmp_path: Path) -> None:
    """500 sockets that never send a byte, under the default limits: /healthz and a turn
    still answer at once, and every idle socket is closed once the header timeout passes."""
    log = tmp_path / "serve.log"
    with (
        postgres_url() as url,
        serve_process(url, workers=1, args=["--header-timeout", "3"], log=log) as (base, _p),
        closing_all(open_idle_sockets(base, 500)) as idle,
    ):
        assert timed_healthz(base) < PROMPT
        turn = httpx.post(
            f"{base}/api/bankingAgent",
            json={"data": {"message": {"role": "user", "content": [{"text": "hi"}]}}, "init": {}},
            timeout=30,
        )
        assert turn.json()["result"]["message"]["content"][0]["text"] == "Echo: hi"
        time.sleep(4.5)  # past the header timeout
        assert sum(is_closed(sock) for sock in idle) == len(idle)
        assert timed_healthz(base) < PROMPT
    assert count_lines(log, "sent no complete request head within 3s") <= 2


def test_past_the_connection_limit_idle_sockets_make_room_for_requests(tmp_path: Path) -> None:
    """600 idle sockets against a limit of 200: the longest-idle ones are closed as new
    connections arrive, so the server never holds more than the limit and /healthz answers
    at once; the flood is logged in a line or two, not one per socket."""
    log = tmp_path / "serve.log"
    limit = 200
    with (
        postgres_url() as url,
        serve_process(url, args=["--limit-connections", str(limit)], log=log) as (base, _p),
        closing_all(open_idle_sockets(base, 600)) as idle,
    ):
        for _ in range(3):
            assert timed_healthz(base) < PROMPT
        time.sleep(0.5)
        still_open = sum(not is_closed(sock) for sock in idle)
        assert still_open <= limit
        assert still_open >= limit // 2  # the newest are kept, not all dropped
        assert all(is_closed(sock) for sock in idle[:100])  # the oldest went first
    assert 1 <= count_lines(log, f"connection limit {limit} reached") <= 2


def test_a_head_sent_a_line_at_a_time_is_cut_off_at_the_header_timeout() -> None:
    """A client trickling header lines (slowloris) is disconnected at --header-timeout,
    although it keeps sending."""
    with postgres_url() as url, serve_process(url, args=["--header-timeout", "2"]) as (base, _p):
        sock = raw_connection(base)
        with sock:
            sock.sendall(b"POST /api/bankingAgent HTTP/1.1\r\nHost: localhost\r\n")
            started = time.monotonic()
            with contextlib.suppress(OSError):
                while time.monotonic() - started < 10:
                    sock.sendall(b"X-Slow: yes\r\n")
                    time.sleep(0.25)
            elapsed = time.monotonic() - started
        assert 1.5 <= elapsed < 5
        assert timed_healthz(base) < PROMPT


def test_a_body_that_stalls_gets_408_at_the_body_deadline() -> None:
    """A body that stops halfway gets 408 with `Connection: close` at --body-timeout, and the
    connection is closed."""
    with postgres_url() as url, serve_process(url, args=["--body-timeout", "2"]) as (base, _p):
        sock = raw_connection(base)
        with sock:
            sock.sendall(
                b"POST /api/bankingAgent HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                b'{"data": {'
            )
            started = time.monotonic()
            sock.settimeout(10)
            answer = b""
            while not answer.endswith(b"}"):
                piece = sock.recv(65536)
                if not piece:
                    break
                answer += piece
            elapsed = time.monotonic() - started
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            assert b"connection: close" in answer.lower()
            assert b'"DEADLINE_EXCEEDED"' in answer
            assert wait_closed(sock, 5) < 5
        assert 1.5 <= elapsed < 5


def test_requests_past_the_concurrency_limit_get_503_but_probes_answer() -> None:
    """With one request in flight and --limit-concurrency 1, the next request gets 503 with
    Retry-After while /healthz answers 200 and /readyz answers, 503 naming the busy slots;
    once the first finishes, requests are served again."""
    args = ["--limit-concurrency", "1", "--limit-connections", "8"]
    with postgres_url() as url, serve_process(url, workers=1, args=args) as (base, _p):
        body = b'{"data": {"message": {"role": "user", "content": [{"text": "hi"}]}}, "init": {}}'
        slow = raw_connection(base)
        with slow:
            slow.sendall(
                b"POST /api/bankingAgent HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[:10]
            )
            time.sleep(0.3)  # the server is now reading that body
            refused = httpx.post(f"{base}/api/bankingAgent", content=body, timeout=10)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["status"] == "UNAVAILABLE"
            assert timed_healthz(base) < PROMPT
            saturated = httpx.get(f"{base}/readyz", timeout=10)
            assert saturated.status_code == 503
            assert "all 1 request slots are busy" in saturated.json()["reason"]
            slow.sendall(body[10:])
            slow.settimeout(30)
            assert slow.recv(65536).startswith(b"HTTP/1.1 200 ")
        served = httpx.post(
            f"{base}/api/bankingAgent",
            content=body,
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert served.status_code == 200


def test_a_flood_of_invalid_requests_is_logged_at_a_bounded_rate(tmp_path: Path) -> None:
    """200 malformed requests get 400 each, but the log holds a handful of lines about them."""
    log = tmp_path / "serve.log"
    with postgres_url() as url, serve_process(url, log=log) as (base, _p):
        for _ in range(200):
            sock = raw_connection(base)
            with sock:
                sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                sock.settimeout(5)
                assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")
        assert timed_healthz(base) < PROMPT
    assert 1 <= count_lines(log, "Invalid HTTP request received") <= 6


def test_a_static_path_with_a_nul_byte_is_a_404_logged_in_one_line(tmp_path: Path) -> None:
    """``/ui/static/…%00`` is not found (404, no sign-in needed), and fifty of them leave no
    traceback in the log: a path no file can have is not a server error."""
    log = tmp_path / "serve.log"
    with (
        postgres_url() as url,
        serve_process(url, log=log, args=["--log-level", "INFO"]) as (
            base,
            _process,
        ),
    ):
        for n in range(50):
            reply = httpx.get(f"{base}/ui/static/app.css%00{n}", timeout=10)
            assert reply.status_code == 404
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    assert count_lines(log, "Traceback") == 0
    assert count_lines(log, "/ui/static/") <= 50
