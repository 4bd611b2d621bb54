"""Browser sessions of the inbox UI: a signed cookie, its CSRF token, and signing in.

A browser never sends the bearer token the JSON API takes. It signs in once: the login form's
token is handed to the server's :data:`~engine.remote.auth.Authenticator` exactly as an
``Authorization: Bearer`` header would be, and the principal it returns is written into a
cookie signed with HMAC-SHA256 (``HttpOnly``, ``SameSite=Strict``, path ``/ui``, ``Secure``
over HTTPS). Every visitor, signed in or not, holds such a cookie: it carries the per-session
CSRF token that each form repeats in a hidden field, so a form posted from another site (which
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
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from engine.remote.auth import Authenticator, Principal, UnauthenticatedError

__all__ = [
    "COOKIE_NAME",
    "CSRF_FIELD",
    "DEFAULT_SESSION_SECONDS",
    "MIN_SECRET_BYTES",
    "SECRET_ENV",
    "BrowserSession",
    "SessionCookies",
    "exchange_token",
]

COOKIE_NAME = "turnstile_ui"
#: The hidden form field every state-changing form carries.
CSRF_FIELD = "csrf_token"
#: The environment variable holding the cookie-signing secret.
SECRET_ENV = "TURNSTILE_UI_SECRET"
#: How long a signed-in session lasts, unless configured otherwise.
DEFAULT_SESSION_SECONDS = 8 * 3600
#: A configured secret shorter than this is refused: it could be guessed offline.
MIN_SECRET_BYTES = 32
_VERSION = "v1"


@dataclass(frozen=True)
class BrowserSession:
    """What a session cookie says: who signed in (``None``: nobody), their roles, the CSRF
    token of the session, and when it ends (Unix seconds)."""

    principal_id: str | None
    roles: frozenset[str]
    csrf: str
    expires: int
    #: Made for this request (no valid cookie came with it): the response must set it.
    fresh: bool = field(default=False, compare=False)

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
        environ: Mapping[str, str] | None = None,
    ) -> None:
        configured = secret if secret is not None else (environ or os.environ).get(SECRET_ENV)
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

    def new(self, principal: Principal | None = None) -> BrowserSession:
        """A fresh session (a new CSRF token too: signing in never keeps the old one)."""
        return BrowserSession(
            principal_id=principal.id if principal is not None else None,
            roles=principal.roles if principal is not None else frozenset(),
            csrf=secrets.token_urlsafe(24),
            expires=int(time.time()) + self.session_seconds,
            fresh=True,
        )

    def read(self, request: Request) -> BrowserSession | None:
        """The request's session, or ``None`` when it has no cookie or one that is forged,
        malformed or expired."""
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
        return _session_of(data)

    def current(self, request: Request) -> BrowserSession:
        """The request's session, or a fresh anonymous one to set on the response."""
        return self.read(request) or self.new()

    def write(self, response: Response, session: BrowserSession, request: Request) -> None:
        """Set the cookie holding ``session`` on ``response``."""
        data = {
            "p": session.principal_id,
            "r": sorted(session.roles),
            "c": session.csrf,
            "e": session.expires,
        }
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


def _session_of(data: Any) -> BrowserSession | None:
    """The session a verified payload describes (``None`` if expired or not well formed)."""
    if not isinstance(data, dict):
        return None
    principal_id, roles, csrf, expires = data.get("p"), data.get("r"), data.get("c"), data.get("e")
    if principal_id is not None and not isinstance(principal_id, str):
        return None
    if not isinstance(roles, list) or not all(isinstance(role, str) for role in roles):
        return None
    if not isinstance(csrf, str) or not isinstance(expires, int) or expires <= time.time():
        return None
    return BrowserSession(
        principal_id=principal_id, roles=frozenset(roles), csrf=csrf, expires=expires
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
