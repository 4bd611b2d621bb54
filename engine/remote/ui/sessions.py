"""Browser sessions of the inbox UI: a signed cookie, a session row, its CSRF token, signing in.

A browser never sends the bearer token the JSON API takes. It signs in once: the login form's
token is handed to the server's :data:`~engine.remote.auth.Authenticator` exactly as an
``Authorization: Bearer`` header would be, and the principal it returns is written into a
session row (:mod:`engine.remote.ui.browser_sessions`, table ``ui_sessions``). The cookie carries
only the row's id, signed with HMAC-SHA256 (``HttpOnly``, ``SameSite=Strict``, path ``/ui``,
``Secure`` over HTTPS); every request reads the row, so logout or an operator's revoke ends the
session at once, in every server process, for every copy of the cookie. A session also ends after
``idle_seconds`` without a request and ``session_seconds`` after signing in, whatever happens.

A visitor who has not signed in holds a cookie too, self-contained (no row): it carries the
CSRF token the login form repeats in a hidden field, so a form posted from another site (which
can neither read the token nor, with ``SameSite=Strict``, send the cookie) is refused.

The signing secret comes from ``TURNSTILE_UI_SECRET`` (or the ``secret`` argument); without
one, each process makes a random secret, so sessions end when it restarts and are not shared
by several server processes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from engine.remote.auth import Authenticator, Principal, UnauthenticatedError
from engine.remote.ui.browser_sessions import (
    MAX_USER_AGENT,
    BrowserSessionRecord,
    BrowserSessionStore,
    new_session_id,
)

__all__ = [
    "COOKIE_NAME",
    "CSRF_FIELD",
    "DEFAULT_IDLE_SECONDS",
    "DEFAULT_SESSION_SECONDS",
    "MIN_SECRET_BYTES",
    "SECRET_ENV",
    "BrowserSession",
    "SessionBook",
    "SessionCookies",
    "client_address",
    "exchange_token",
]

COOKIE_NAME = "turnstile_ui"
#: The hidden form field every state-changing form carries.
CSRF_FIELD = "csrf_token"
#: The environment variable ``turnstile serve`` takes the cookie-signing secret from (named in
#: messages; read by ``stores.settings``).
SECRET_ENV = "TURNSTILE_UI_SECRET"
#: How long a signed-in session lasts at most, unless configured otherwise.
DEFAULT_SESSION_SECONDS = 8 * 3600
#: How long a signed-in session survives without a request, unless configured otherwise.
DEFAULT_IDLE_SECONDS = 3600
#: A configured secret shorter than this is refused: it could be guessed offline.
MIN_SECRET_BYTES = 32
#: A session's ``last_seen_at`` is written at most this often (a write per page view is waste).
TOUCH_SECONDS = 60
_VERSION = "v2"


@dataclass(frozen=True)
class BrowserSession:
    """The session of a request: who signed in (``None``: nobody), their roles, the CSRF
    token of the session, when it ends (Unix seconds), and the id of its row (``None`` for a
    visitor who has not signed in: such sessions live in the cookie alone)."""

    principal_id: str | None
    roles: frozenset[str]
    csrf: str
    expires: int
    #: Made for this request (no valid cookie came with it): the response must set it.
    fresh: bool = field(default=False, compare=False)
    id: str | None = None

    @property
    def principal(self) -> Principal | None:
        """The signed-in principal, or ``None`` for an anonymous session."""
        if self.principal_id is None:
            return None
        return Principal(id=self.principal_id, roles=self.roles)

    def csrf_matches(self, offered: str | None) -> bool:
        """Whether a form's token is this session's (compared in constant time)."""
        return offered is not None and hmac.compare_digest(offered.encode(), self.csrf.encode())


class SessionCookies:
    """Makes, signs, reads and clears the session cookie."""

    def __init__(
        self,
        secret: str | bytes | None = None,
        *,
        session_seconds: int = DEFAULT_SESSION_SECONDS,
    ) -> None:
        configured = secret
        if configured is None or configured == "":
            #: Whether the secret was made here (sessions end with this process).
            self.ephemeral = True
            raw = secrets.token_bytes(32)
        else:
            self.ephemeral = False
            raw = configured.encode() if isinstance(configured, str) else configured
            if len(raw) < MIN_SECRET_BYTES:
                raise ValueError(
                    f"The UI session secret ({SECRET_ENV}) must be at least {MIN_SECRET_BYTES} "
                    f"bytes long; it has {len(raw)}. Generate one with: "
                    "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
                )
        if session_seconds < 60:
            raise ValueError("A UI session must last at least 60 seconds.")
        # A key of its own, so the secret could sign other things without confusion.
        self._key = hmac.new(raw, b"turnstile-ui-session", hashlib.sha256).digest()
        self.session_seconds = session_seconds

    def new(self) -> BrowserSession:
        """A fresh anonymous session (its own CSRF token)."""
        return BrowserSession(
            principal_id=None,
            roles=frozenset(),
            csrf=secrets.token_urlsafe(24),
            expires=int(time.time()) + self.session_seconds,
            fresh=True,
        )

    def _payload(self, request: Request) -> dict[str, Any] | None:
        """The verified payload of the request's cookie (``None``: none, forged, malformed)."""
        value = request.cookies.get(COOKIE_NAME)
        if not value or len(value) > 4096:
            return None
        version, _, rest = value.partition(".")
        payload, _, signature = rest.partition(".")
        if version != _VERSION or not payload or not signature:
            return None
        if not hmac.compare_digest(self._sign(payload), signature):
            return None
        try:
            data: Any = json.loads(_unpad(payload))
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def read(self, request: Request) -> BrowserSession | None:
        """The request's anonymous session, or ``None`` when it has no such cookie (none, a
        forged, malformed or expired one, or a signed-in session's: see :meth:`session_id`)."""
        data = self._payload(request)
        return _anonymous_of(data) if data is not None else None

    def session_id(self, request: Request) -> str | None:
        """The session id a signed-in browser's cookie carries (verified), or ``None``."""
        data = self._payload(request)
        found = data.get("s") if data is not None else None
        return found if isinstance(found, str) and 0 < len(found) <= 128 else None

    def current(self, request: Request) -> BrowserSession:
        """The request's anonymous session, or a fresh one to set on the response."""
        return self.read(request) or self.new()

    def write(self, response: Response, session: BrowserSession, request: Request) -> None:
        """Set the cookie holding ``session`` on ``response`` (only its id if it has a row)."""
        data: dict[str, Any] = (
            {"s": session.id}
            if session.id is not None
            else {"c": session.csrf, "e": session.expires}
        )
        payload = base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
        response.set_cookie(
            COOKIE_NAME,
            f"{_VERSION}.{payload}.{self._sign(payload)}",
            max_age=max(0, session.expires - int(time.time())),
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def clear(self, response: Response, request: Request) -> None:
        """Remove the cookie (logout)."""
        response.delete_cookie(
            COOKIE_NAME,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def _sign(self, payload: str) -> str:
        digest = hmac.new(self._key, payload.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _unpad(payload: str) -> bytes:
    return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))


def _anonymous_of(data: dict[str, Any]) -> BrowserSession | None:
    """The anonymous session a verified payload describes (``None``: expired, or not one)."""
    csrf, expires = data.get("c"), data.get("e")
    if not isinstance(csrf, str) or not isinstance(expires, int) or expires <= time.time():
        return None
    return BrowserSession(principal_id=None, roles=frozenset(), csrf=csrf, expires=expires)


def client_address(request: Request) -> str:
    """The address the request came from, as the server saw it (``unknown`` without one)."""
    return request.client.host if request.client is not None else "unknown"


class SessionBook:
    """Signed-in sessions: rows in a
    :class:`~engine.remote.ui.browser_sessions.BrowserSessionStore`, found through the cookie's id
    on every request."""

    def __init__(
        self,
        cookies: SessionCookies,
        store: BrowserSessionStore,
        *,
        idle_seconds: int = DEFAULT_IDLE_SECONDS,
    ) -> None:
        if idle_seconds < 60:
            raise ValueError("A UI session's idle limit must be at least 60 seconds.")
        self.cookies = cookies
        self.store = store
        self.idle = timedelta(seconds=idle_seconds)

    async def current(self, request: Request) -> BrowserSession:
        """The request's session: its live row's, else an anonymous one (fresh when the
        cookie names a session that ended, so the response replaces that cookie)."""
        session_id = self.cookies.session_id(request)
        if session_id is None:
            return self.cookies.current(request)
        now = datetime.now(UTC)
        row = await self.store.get_browser_session(session_id)
        if row is None or not row.live_at(now, self.idle):
            return self.cookies.new()
        stale = now - row.last_seen_at >= timedelta(seconds=TOUCH_SECONDS)
        # Guarded: a session revoked since the read above is not revived, and refused.
        if stale and not await self.store.touch_browser_session(row.id, now=now):
            return self.cookies.new()
        return _session_of(row)

    async def is_live(self, session: BrowserSession) -> bool:
        """Whether the signed-in ``session`` is still live (read again, never touched)."""
        if session.id is None:
            return False
        row = await self.store.get_browser_session(session.id)
        return row is not None and row.live_at(datetime.now(UTC), self.idle)

    async def sign_in(self, principal: Principal, request: Request) -> BrowserSession:
        """A new session row for ``principal`` (with a new CSRF token: one seen before
        signing in is worth nothing after), to set as the response's cookie."""
        now = datetime.now(UTC)
        row = BrowserSessionRecord(
            id=new_session_id(),
            principal=principal.id,
            roles=tuple(sorted(principal.roles)),
            csrf=secrets.token_urlsafe(24),
            created_at=now,
            last_seen_at=now,
            expires_at=now + timedelta(seconds=self.cookies.session_seconds),
            user_agent=request.headers.get("user-agent", "")[:MAX_USER_AGENT],
            client_address=client_address(request),
        )
        await self.store.create_browser_session(row)
        return replace(_session_of(row), fresh=True)

    async def sign_out(self, session: BrowserSession) -> None:
        """Revoke ``session``'s row (every copy of its cookie stops working)."""
        if session.id is not None:
            await self.store.revoke_browser_sessions(now=datetime.now(UTC), session_id=session.id)


def _session_of(row: BrowserSessionRecord) -> BrowserSession:
    return BrowserSession(
        principal_id=row.principal,
        roles=frozenset(row.roles),
        csrf=row.csrf,
        expires=int(row.expires_at.timestamp()),
        id=row.id,
    )


async def exchange_token(auth: Authenticator, request: Request, token: str) -> Principal:
    """The principal ``auth`` finds for ``token``, offered as ``Authorization: Bearer``.

    With an empty ``token`` the request goes to ``auth`` as it came, so an authenticator that
    reads something else (a header set by a proxy, a client certificate) signs the browser in
    from that. Raises what ``auth`` raises (an ``UnauthenticatedError`` for a bad token).
    """
    if not token:
        return await auth(request)
    if not token.isascii() or not token.isprintable() or len(token) > 4096:
        raise UnauthenticatedError("Invalid token: a token is printable ASCII text.")
    headers = [
        (name, value)
        for name, value in request.scope["headers"]
        if name not in (b"authorization", b"cookie", b"content-type", b"content-length")
    ]
    headers.append((b"authorization", f"Bearer {token}".encode("latin-1")))
    scope = {**request.scope, "headers": headers, "method": "GET"}
    return await auth(Request(scope))
