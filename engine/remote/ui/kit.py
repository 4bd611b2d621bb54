"""What every page handler shares: who is viewing, rendering, forms, CSRF, error pages.

Pages are Jinja2 templates rendered on the server with autoescaping; every response carries a
Content-Security-Policy that allows only this server's own scripts and styles (no inline
code), is never cached, and may not be framed.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import jinja2
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from engine.errors import AgentError, InvalidArgumentError
from engine.remote.auth import Authenticator, Principal
from engine.remote.ui import present
from engine.remote.ui.browser_sessions import BrowserSessionStore
from engine.remote.ui.login_limits import (
    DEFAULT_LOGIN_LIMIT,
    DEFAULT_LOGIN_WINDOW_SECONDS,
    LoginLimiter,
)
from engine.remote.ui.queries import Catalog
from engine.remote.ui.sessions import (
    COOKIE_NAME,
    CSRF_FIELD,
    DEFAULT_IDLE_SECONDS,
    BrowserSession,
    SessionBook,
    SessionCookies,
)
from engine.remote.wire import (
    BodyTooLargeError,
    UnsupportedMediaTypeError,
    client_error,
    http_status,
)

__all__ = ["CsrfRefusedError", "NotSignedInError", "PageKit", "UiSettings", "Viewer"]

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
#: The form content type every page posts (plain HTML forms, no files).
FORM_TYPE = "application/x-www-form-urlencoded"
#: Most fields a form may post; decision forms have one per schema property.
MAX_FORM_FIELDS = 200
#: How often the inbox looks for new approvals, in seconds, unless configured otherwise.
DEFAULT_POLL_SECONDS = 3.0

_SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}


@dataclass(frozen=True)
class UiSettings:
    """How the inbox UI runs: the cookie secret (``None``: one made per process), how long a
    signed-in session lasts at most and without a request, how often pages look for changes
    (seconds; ``None``: 3), how many failed sign-ins a client address or account may make per
    window, and where sessions are kept (``None``: this process's memory; ``turnstile serve``
    gives the SQL one of its database, :class:`stores.ui_sessions.SqlBrowserSessions`).

    Nothing here is read from the environment: ``turnstile serve`` passes the secret and the
    polling interval of its settings (``TURNSTILE_UI_SECRET``, ``TURNSTILE_UI_POLL_SECONDS``),
    and an app serving :func:`engine.remote.create_app` itself passes
    ``current_settings().ui_settings()`` (``stores.settings``)."""

    secret: str | bytes | None = None
    session_seconds: int = 8 * 3600
    poll_seconds: float | None = None
    idle_seconds: int = DEFAULT_IDLE_SECONDS
    login_limit: int = DEFAULT_LOGIN_LIMIT
    login_window_seconds: int = DEFAULT_LOGIN_WINDOW_SECONDS
    session_store: BrowserSessionStore | None = field(default=None, compare=False)

    def poll_interval(self) -> float:
        """The polling interval: configured, else :data:`DEFAULT_POLL_SECONDS`."""
        return self.poll_seconds if self.poll_seconds is not None else DEFAULT_POLL_SECONDS


@dataclass(frozen=True)
class Viewer:
    """Who looks at a page: the browser session and its principal (``None`` on an open
    server, where nobody signs in)."""

    session: BrowserSession
    principal: Principal | None
    open_server: bool

    @property
    def id(self) -> str | None:
        """The principal id recorded as decider (``None`` on an open server)."""
        return self.principal.id if self.principal is not None else None


class NotSignedInError(Exception):
    """The server has an authenticator and this browser has not signed in."""


class CsrfRefusedError(Exception):
    """A form came without this session's CSRF token: forged, or from an older session."""


class PageKit:
    """Rendering and request plumbing shared by the page handlers of one app."""

    def __init__(
        self,
        catalog: Catalog,
        auth: Authenticator | None,
        settings: UiSettings,
        max_body_bytes: int,
        session_store: BrowserSessionStore,
    ) -> None:
        self.catalog = catalog
        self.auth = auth
        self.settings = settings
        self.poll_seconds = settings.poll_interval()
        self.max_body_bytes = max_body_bytes
        self.cookies = SessionCookies(settings.secret, session_seconds=settings.session_seconds)
        self.sessions = SessionBook(self.cookies, session_store, idle_seconds=settings.idle_seconds)
        self.login_limiter = LoginLimiter(
            session_store,
            limit=settings.login_limit,
            window_seconds=settings.login_window_seconds,
        )
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            value=present.format_value,
            moment=present.moment,
            answer=present.answer_summary,
            summary=present.input_summary,
        )

    # -- who -----------------------------------------------------------------------------

    async def viewer(self, request: Request) -> Viewer:
        """The viewer of ``request``; :class:`NotSignedInError` when one must sign in (none
        signed in, or the session ended: logged out, revoked, idle, expired)."""
        session = await self._session(request)
        if self.auth is None:
            return Viewer(session=session, principal=None, open_server=True)
        if session.principal is None:
            raise NotSignedInError
        return Viewer(session=session, principal=session.principal, open_server=False)

    async def anonymous(self, request: Request) -> Viewer:
        """The viewer of a page anyone may open (the login page)."""
        session = await self._session(request)
        return Viewer(session=session, principal=session.principal, open_server=self.auth is None)

    def cookie_viewer(self, request: Request) -> Viewer:
        """The viewer as the cookie alone says, for an error page (no database read: a
        signed-in browser shows as not signed in there)."""
        session = self.cookies.current(request)
        return Viewer(session=session, principal=None, open_server=self.auth is None)

    async def _session(self, request: Request) -> BrowserSession:
        # An open server signs nobody in: its cookie only carries the CSRF token.
        if self.auth is None:
            return self.cookies.current(request)
        return await self.sessions.current(request)

    # -- responses -----------------------------------------------------------------------

    def url(self, request: Request, path: str, query: Mapping[str, str] | None = None) -> str:
        """A link to ``path`` under the app's root, with ``query``."""
        root = str(request.scope.get("root_path", "")).rstrip("/")
        tail = f"?{urlencode(query)}" if query else ""
        return f"{root}{path}{tail}"

    def page(
        self,
        request: Request,
        viewer: Viewer,
        template: str,
        context: Mapping[str, Any],
        *,
        status: int = 200,
    ) -> Response:
        """Render ``template`` for ``viewer``."""

        def url(path: str, **query: str) -> str:
            return self.url(request, path, {k: v for k, v in query.items() if v})

        html = self.env.get_template(template).render(
            **{"nav": "", **context},
            viewer=viewer,
            csrf_field=CSRF_FIELD,
            url=url,
            segment=segment,
            static=lambda name: self.url(request, f"/ui/static/{name}"),
            poll_seconds=self.poll_seconds,
        )
        return self.finish(HTMLResponse(html, status_code=status), request, viewer)

    def json(self, request: Request, viewer: Viewer, data: Any, *, status: int = 200) -> Response:
        """A JSON answer of a page's script."""
        return self.finish(JSONResponse(data, status_code=status), request, viewer)

    def redirect(
        self, request: Request, viewer: Viewer | None, path: str, **query: str
    ) -> Response:
        """A 303 to a path of this app (relative to the root: never the request's Host)."""
        response = RedirectResponse(self.url(request, path, query or None), status_code=303)
        return self.finish(response, request, viewer)

    def finish(self, response: Response, request: Request, viewer: Viewer | None) -> Response:
        """Add the security headers, and the cookie of a session made for this request."""
        response.headers.update(_SECURITY_HEADERS)
        if viewer is not None and viewer.session.fresh:
            self.cookies.write(response, viewer.session, request)
        return response

    def error(
        self,
        request: Request,
        viewer: Viewer | None,
        status: int,
        title: str,
        message: str,
    ) -> Response:
        """An error page: what went wrong, in words, with the HTTP status that says it."""
        # A refusal leaves the browser's cookie as it is (another site cannot sign it out).
        if viewer is None:
            anonymous = self.cookie_viewer(request)
            viewer = replace(anonymous, session=replace(anonymous.session, fresh=False))
        return self.page(
            request, viewer, "error.html", {"title": title, "message": message}, status=status
        )

    def agent_error(self, request: Request, viewer: Viewer | None, error: AgentError) -> Response:
        """The error page of an engine error, with its HTTP status (never a 500 for input)."""
        error = client_error(error)
        status = http_status(error)
        titles = {
            400: "That request cannot be used",
            403: "Not allowed",
            404: "Not found",
            409: "Already changed",
            413: "Too large",
            415: "Wrong form encoding",
        }
        return self.error(request, viewer, status, titles.get(status, "Error"), error.message)

    def not_signed_in(self, request: Request) -> Response:
        """Send a browser that has not signed in to the login page (a 401 for posts)."""
        if request.method == "GET":
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return self.redirect(request, None, "/ui/login", next=target)
        return self.error(
            request,
            None,
            401,
            "Sign in first",
            "Your session ended or you have not signed in; nothing was changed.",
        )

    def cross_site(self, request: Request) -> bool:
        """Whether the browser says another site's page sent this request."""
        return request.headers.get("sec-fetch-site") == "cross-site"

    def arrived_from_another_site(self, request: Request) -> bool:
        """Whether this is a link followed from another site's page that carries none of our
        cookies: with ``SameSite=Strict`` the browser held the session cookie back, so the
        request looks signed out although the browser is not."""
        return (
            request.method == "GET"
            and self.cross_site(request)
            and COOKIE_NAME not in request.cookies
        )

    def same_site_again(self, request: Request) -> Response:
        """Ask the browser for the same page again, from this site: the page reloads itself,
        and the reload carries the session cookie. Nothing is set on this response, so the
        browser's cookie is left as it was (answering with the login page would have replaced
        it with an anonymous one, signing the browser out)."""
        query = f"?{request.url.query}" if request.url.query else ""
        target = html.escape(request.url.path + query)
        body = (
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="refresh" content="0;url={target}">'
            "<title>Opening…</title></head><body>"
            f'<p><a href="{target}">Continue to the approval inbox</a></p></body></html>'
        )
        return HTMLResponse(body, headers=_SECURITY_HEADERS)

    def csrf_refused(self, request: Request) -> Response:
        """The answer to a form without this session's CSRF token: 403, nothing changed (the
        browser's cookie included)."""
        return self.error(
            request,
            None,
            403,
            "Form refused",
            "This form did not carry this session's security token (it may be forged, or "
            "from a page opened before you signed in again). Nothing was changed: reload the "
            "page and try again.",
        )

    # -- forms ---------------------------------------------------------------------------

    async def form(self, request: Request) -> dict[str, str]:
        """The posted form fields (URL-encoded only, bounded in size and count)."""
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != FORM_TYPE:
            raise UnsupportedMediaTypeError(
                f"Pages post {FORM_TYPE} forms; this request sent {media or 'no content type'}."
            )
        body = bytearray()
        try:
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > self.max_body_bytes:
                    raise BodyTooLargeError(f"The form is larger than {self.max_body_bytes} bytes.")
        except ClientDisconnect as exc:
            raise InvalidArgumentError("The browser went away before sending the form.") from exc
        try:
            text = body.decode("utf-8")
            pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidArgumentError(f"The form could not be read: {exc}.") from exc
        fields: dict[str, str] = {}
        for name, value in pairs:
            if "\x00" in name or "\x00" in value:
                raise InvalidArgumentError("The form holds a NUL character.")
            fields.setdefault(name, value)
        return fields

    def check_csrf(self, request: Request, viewer: Viewer, form: Mapping[str, str]) -> None:
        """Refuse a form without the session's token, or sent by another site's page."""
        # Browsers say where a request comes from; another site's page is refused outright.
        if self.cross_site(request):
            raise CsrfRefusedError
        if viewer.session.fresh or not viewer.session.csrf_matches(form.get(CSRF_FIELD)):
            raise CsrfRefusedError


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path of the UI only (no other site, no scheme)."""
    if not target or not target.startswith("/ui") or target.startswith("//"):
        return "/ui"
    if any(c in target for c in "\\\r\n\t") or "://" in target:
        return "/ui"
    return target


def segment(value: str) -> str:
    """``value`` as one path segment of a link (ids may hold ``/``, ``?`` or ``#``)."""
    return quote(value, safe="")


def query_of(request: Request) -> dict[str, str]:
    """The query string as a plain mapping (the first value of each name)."""
    return dict(parse_qsl(request.url.query, keep_blank_values=True))
