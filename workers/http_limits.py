"""Connection and request limits of ``turnstile serve`` (and of a worker's health port).

uvicorn on its own keeps a connection that never sends a byte open forever (its keep-alive
timer starts only after a first response, and any byte cancels it), and its
``limit_concurrency`` counts idle connections too, so a flood of idle sockets answers every
real request — health probes included — with 503 until the file descriptors run out. Here:

* :func:`guarded_protocol` — uvicorn's h11 protocol with a *header timeout* (a connection
  must deliver a complete request head within it, from its opening or from its previous
  response) and a *connection limit*: past it, the connection idle for longest is closed to
  make room, and only when every connection is busy is the newcomer closed. Idle sockets
  can therefore never lock out a request.
* :class:`BodyDeadline` — a deadline on reading a request's whole body: 408, then the
  connection is closed.
* :class:`RequestLimits` — requests served at once, in three budgets (sign-in, event streams,
  the rest), each in all and per client address; past them, 503 or 429 with ``Retry-After``.
  Probes and ``/metrics`` are exempt.
* :class:`RateLimitedLog` — a logging filter that lets a burst of each kind of line through
  and then one line per interval with the count of those it held back.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "PROBE_PATHS",
    "BodyDeadline",
    "ConnectionLimits",
    "RateLimitedLog",
    "RequestLimits",
    "RequestSlots",
    "SlotBudget",
    "default_connection_limit",
    "guarded_protocol",
]

logger = logging.getLogger("turnstile.http")

#: Paths every limit on requests lets through: probes must answer while the server is busy.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: The connection limit when none is given, unless the open-file limit calls for fewer.
DEFAULT_MAX_CONNECTIONS = 1000
#: Seconds between two log lines about the same kind of refused or closed connections.
FLOOD_LOG_INTERVAL = 10.0
#: The sign-in form's path: anyone may post to it, so it has a budget of its own.
SIGN_IN_PATH = "/ui/login"
#: The web UI's event streams: each lasts minutes, so they have a budget of their own.
EVENT_STREAM_PATH = "/ui/events"
#: Sign-ins served at once, in all and per client address (a form post takes milliseconds).
SIGN_IN_SLOTS = 16
SIGN_IN_SLOTS_PER_CLIENT = 4
#: Seconds a sign-in may take to send its body (a few hundred bytes).
SIGN_IN_BODY_SECONDS = 5.0


def default_connection_limit() -> int:
    """:data:`DEFAULT_MAX_CONNECTIONS`, or half the process's open-file limit when that is
    lower: the other half stays for database connections, files and the listening sockets."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(16, min(DEFAULT_MAX_CONNECTIONS, soft // 2))


@dataclass(frozen=True)
class SlotBudget:
    """How many requests of one kind are served at once: in all, and from one client address
    (the connection's, or the one a trusted proxy names in ``X-Forwarded-For``)."""

    total: int
    per_client: int


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits of one HTTP listener (``docs/configuration.md`` explains each flag)."""

    max_connections: int
    max_requests: int
    #: Requests one client address may have in flight (``None``: a quarter of max_requests).
    max_requests_per_client: int | None = None
    #: Event streams open at once (``None``: a quarter of max_connections).
    max_streams: int | None = None
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive: int = 5
    max_header_bytes: int = 16384
    backlog: int = 2048

    @property
    def requests(self) -> SlotBudget:
        """The budget of ordinary requests."""
        per_client = self.max_requests_per_client or max(1, self.max_requests // 4)
        return SlotBudget(self.max_requests, min(per_client, self.max_requests))

    @property
    def streams(self) -> SlotBudget:
        """The budget of ``/ui/events`` streams (a client address may hold a quarter)."""
        total = self.max_streams or max(1, self.max_connections // 4)
        return SlotBudget(total, max(1, total // 4))

    @property
    def sign_ins(self) -> SlotBudget:
        """The budget of ``/ui/login`` requests."""
        return SlotBudget(SIGN_IN_SLOTS, SIGN_IN_SLOTS_PER_CLIENT)

    @property
    def body_deadlines(self) -> dict[str, float]:
        """Paths whose bodies must arrive sooner than :attr:`body_timeout`."""
        return {SIGN_IN_PATH: min(SIGN_IN_BODY_SECONDS, self.body_timeout)}

    def uvicorn_options(self) -> dict[str, Any]:
        """The ``uvicorn.Config`` options these limits set."""
        return {
            "http": guarded_protocol(self),
            "ws": "none",
            "backlog": self.backlog,
            "timeout_keep_alive": self.keep_alive,
            "h11_max_incomplete_event_size": self.max_header_bytes,
        }


class _Throttled:
    """Counts events and logs ``message % count`` at most once per
    :data:`FLOOD_LOG_INTERVAL` (the first event of a quiet spell at once)."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.count = 0
        self.last = -FLOOD_LOG_INTERVAL

    def add(self) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= FLOOD_LOG_INTERVAL:
            logger.warning(self.message, self.count)
            self.count, self.last = 0, now


class _ConnectionGuard:
    """The connections of one listener, the idle ones in the order they became idle.

    Idle: opened, or done with a response, and no complete request head since. Only idle
    connections have a header timer, and only they are closed to make room.
    """

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open: set[H11Protocol] = set()
        self.idle: dict[H11Protocol, asyncio.TimerHandle] = {}
        most = limits.max_connections
        self.evicted = _Throttled(
            f"connection limit {most} reached: closed %d idle connection(s) to admit new ones"
        )
        self.refused = _Throttled(
            f"connection limit {most} reached, every connection busy: refused %d connection(s)"
        )
        self.timed_out = _Throttled(
            f"closed %d connection(s) that sent no complete request head within "
            f"{limits.header_timeout:g}s"
        )

    def opened(self, connection: H11Protocol) -> None:
        if len(self.open) >= self.limits.max_connections:
            oldest = next(iter(self.idle), None)
            if oldest is None:
                self.refused.add()
                connection.transport.close()
                return
            self.closed(oldest)
            oldest.transport.close()
            self.evicted.add()
        self.open.add(connection)
        self._wait_for_head(connection)

    def update(self, connection: H11Protocol) -> None:
        """After data arrived or a response completed: idle or busy now?"""
        if connection not in self.open:
            return
        cycle = connection.cycle
        if cycle is not None and not cycle.response_complete:
            timer = self.idle.pop(connection, None)
            if timer is not None:
                timer.cancel()
        elif connection not in self.idle and not connection.transport.is_closing():
            self._wait_for_head(connection)

    def closed(self, connection: H11Protocol) -> None:
        self._forget(connection)
        self.open.discard(connection)

    def _wait_for_head(self, connection: H11Protocol) -> None:
        loop = asyncio.get_running_loop()
        self.idle[connection] = loop.call_later(
            self.limits.header_timeout, self._expire, connection
        )

    def _expire(self, connection: H11Protocol) -> None:
        if self.idle.pop(connection, None) is not None:
            connection.transport.close()
            self.timed_out.add()

    def _forget(self, connection: H11Protocol) -> None:
        timer = self.idle.pop(connection, None)
        if timer is not None:
            timer.cancel()


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with ``limits``' header timeout and connection limit (one
    guard per listener: call once per server)."""
    guard = _ConnectionGuard(limits)

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            guard.opened(self)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            guard.update(self)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            guard.update(self)

        def connection_lost(self, exc: Exception | None) -> None:
            guard.closed(self)
            super().connection_lost(exc)

    return GuardedH11Protocol


def _error(status: int, code: str, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"status": code, "message": message}, status_code=status, headers=headers)


class BodyDeadline:
    """ASGI middleware: a request's body must arrive whole within ``seconds`` of its head.

    Past the deadline the client gets 408 with ``Connection: close`` (unless a response has
    started), and the app reads a disconnect, as if the client had gone away. ``per_path``
    gives some paths a deadline of their own.
    """

    def __init__(
        self, app: ASGIApp, seconds: float, per_path: Mapping[str, float] | None = None
    ) -> None:
        self.app = app
        self.seconds = seconds
        self.per_path = dict(per_path or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seconds = self.per_path.get(scope.get("path", ""), self.seconds)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        body_done = False
        started = expired = False

        async def guarded_send(message: ASGIMessage) -> None:
            nonlocal started
            if expired:
                return  # the 408 went out in the app's place
            started = started or message["type"] == "http.response.start"
            await send(message)

        async def timed_receive() -> ASGIMessage:
            nonlocal body_done, expired
            if body_done or expired:
                return await receive()  # e.g. a streaming response waiting for a disconnect
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                if not started:
                    timeout = _error(
                        408,
                        "DEADLINE_EXCEEDED",
                        f"The request body did not arrive within {seconds:g}s.",
                        connection="close",
                    )
                    await timeout(scope, receive, send)
                expired = True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        await self.app(scope, timed_receive, guarded_send)


class _Slots:
    """The requests of one kind being served, counted in all and per client address."""

    def __init__(self, kind: str, budget: SlotBudget) -> None:
        self.kind = kind
        self.budget = budget
        self.active = 0
        self.by_client: dict[str, int] = {}
        self.busy_refusals = _Throttled(
            f"{kind} limit {budget.total} reached: refused %d request(s) with 503"
        )
        self.client_refusals = _Throttled(
            f"{kind} limit {budget.per_client} per client address reached: "
            "refused %d request(s) with 429"
        )

    def take(self, client: str) -> int | None:
        """Take a slot for ``client``; or the status refusing it (503: every slot is busy,
        429: this client holds its share)."""
        if self.active >= self.budget.total:
            self.busy_refusals.add()
            return 503
        held = self.by_client.get(client, 0)
        if held >= self.budget.per_client:
            self.client_refusals.add()
            return 429
        self.active += 1
        self.by_client[client] = held + 1
        return None

    def give_back(self, client: str) -> None:
        self.active -= 1
        held = self.by_client[client] - 1
        if held:
            self.by_client[client] = held
        else:  # the table holds only clients with a request in flight
            del self.by_client[client]


class RequestSlots:
    """The request slots of one server, shared by :class:`RequestLimits` (which takes them)
    and the readiness probe (which reports them).

    Requests fall into three kinds, each with its own budget, so that one kind cannot take
    the others' room: sign-in (``/ui/login``: anyone may send it, before any authentication),
    event streams (``/ui/events``: each lasts minutes) and every other request. Probes and
    ``/metrics`` take no slot.
    """

    def __init__(self, limits: ConnectionLimits) -> None:
        self.requests = _Slots("request", limits.requests)
        self.sign_in = _Slots("sign-in", limits.sign_ins)
        self.streams = _Slots("event stream", limits.streams)

    def for_path(self, path: str) -> _Slots | None:
        """The slots a request for ``path`` takes (``None``: a probe, which takes none)."""
        if path in PROBE_PATHS:
            return None
        if path == SIGN_IN_PATH:
            return self.sign_in
        if path == EVENT_STREAM_PATH:
            return self.streams
        return self.requests

    def saturation(self) -> str | None:
        """Why this server cannot take another ordinary request now (``None``: it can)."""
        if self.requests.active >= self.requests.budget.total:
            return f"all {self.requests.budget.total} request slots are busy"
        return None

    def describe(self) -> str:
        """The slots in use, for the readiness probe."""
        return (
            f"{self.requests.active} of {self.requests.budget.total} request slots busy, "
            f"{self.streams.active} event stream(s), {self.sign_in.active} sign-in(s)"
        )


def _client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class RequestLimits:
    """ASGI middleware taking a slot of ``slots`` for each request (see :class:`RequestSlots`).

    A request that finds every slot of its kind busy gets 503 with ``Retry-After``; one whose
    client address already holds its share gets 429 with ``Retry-After``.
    """

    def __init__(self, app: ASGIApp, slots: RequestSlots) -> None:
        self.app = app
        self.slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        slots = self.slots.for_path(scope.get("path", "")) if scope["type"] == "http" else None
        if slots is None:
            await self.app(scope, receive, send)
            return
        client = _client_address(scope)
        refusal = slots.take(client)
        if refusal is not None:
            await _refusal(refusal, slots.kind)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            slots.give_back(client)


def _refusal(status: int, kind: str) -> JSONResponse:
    if status == 429:
        return _error(
            429,
            "RESOURCE_EXHAUSTED",
            f"This address has as many {kind}s in progress as it may; retry shortly.",
            **{"retry-after": "1"},
        )
    return _error(
        503,
        "UNAVAILABLE",
        f"The server is serving as many {kind}s as it may; retry shortly.",
        **{"retry-after": "1"},
    )


class RateLimitedLog(logging.Filter):
    """Lets ``burst`` lines of each kind through per ``interval`` seconds, holds back the
    rest, and notes on the next line let through how many were held back.

    A line's kind is its message template (its first line, for composed messages), so a
    flood of one warning — invalid requests, refused accepts — costs a few lines a minute.
    """

    def __init__(self, burst: int = 5, interval: float = 60.0) -> None:
        super().__init__()
        self.burst = burst
        self.interval = interval
        self._windows: dict[str, tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = str(record.msg).split("\n", 1)[0][:120]
        now = time.monotonic()
        start, passed, held = self._windows.get(kind, (now, 0, 0))
        if now - start >= self.interval:
            start, passed = now, 0
        if passed >= self.burst:
            self._windows[kind] = (start, passed, held + 1)
            return False
        if held:
            record.msg = f"{record.msg} ({held} similar line(s) held back)"
        if len(self._windows) > 1000:  # kinds are few; never let the table grow unbounded
            self._windows.clear()
        self._windows[kind] = (start, passed + 1, 0)
        return True
