"""A real webhook receiver for the tests: an HTTP server on a fixed local port that records
every request it accepts, checks its signature, and can go down and come back on the same
port (:meth:`Receiver.stop`, :meth:`Receiver.start`) or answer errors (``fail_with``)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from engine.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from tests.http_support import free_port

__all__ = ["Received", "Receiver", "receiving"]


@dataclass(frozen=True)
class Received:
    """One request the receiver accepted."""

    headers: dict[str, str]
    body: str
    signed: bool

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed

    @property
    def event_id(self) -> str:
        return self.headers["Turnstile-Event-Id"]


@dataclass
class Receiver:
    """The receiver at ``url``; ``received`` lists what it accepted (2xx), oldest first."""

    secret: str
    port: int = field(default_factory=free_port)
    received: list[Received] = field(default_factory=list)
    #: Answer every request with this status instead of accepting it (``None``: accept).
    fail_with: int | None = None
    refused: int = 0
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def start(self) -> None:
        """Listen (again) on the receiver's port."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length).decode()
                headers = dict(self.headers.items())
                with receiver._lock:
                    status = receiver.fail_with
                    if status is None:
                        signed = verify(
                            receiver.secret,
                            headers.get(TIMESTAMP_HEADER, ""),
                            body,
                            headers.get(SIGNATURE_HEADER, ""),
                        )
                        receiver.received.append(Received(headers, body, signed))
                    else:
                        receiver.refused += 1
                self.send_response(status or 204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        """Stop listening: connections are refused until :meth:`start`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def events(self) -> list[str]:
        """The event ids accepted so far, in order."""
        with self._lock:
            return [r.event_id for r in self.received]


@contextlib.contextmanager
def receiving(secret: str) -> Iterator[Receiver]:
    """A started receiver, stopped on exit."""
    receiver = Receiver(secret=secret)
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
