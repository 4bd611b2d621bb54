"""Signing in and out of the inbox UI.

The login form's token goes to the server's authenticator as a bearer token would; the
principal it names is written into a new signed session (a new CSRF token with it, so a token
seen before signing in is worth nothing after). The login form carries a CSRF token too, so
another site cannot sign a browser in as someone else.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import AgentError
from engine.remote.ui.kit import (
    CsrfRefusedError,
    NotSignedInError,
    PageKit,
    Viewer,
    query_of,
    safe_next,
)
from engine.remote.ui.sessions import exchange_token

__all__ = ["AuthPages"]


class AuthPages:
    """``GET``/``POST /ui/login`` and ``POST /ui/logout``."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit

    def _login_page(
        self, request: Request, viewer: Viewer, target: str, *, problem: str | None, status: int
    ) -> Response:
        seconds = self.kit.cookies.session_seconds
        length = f"{seconds // 3600} hours" if seconds >= 7200 else f"{seconds // 60} minutes"
        context = {"nav": "", "next": target, "problem": problem, "session_length": length}
        return self.kit.page(request, viewer, "login.html", context, status=status)

    async def login_form(self, request: Request) -> Response:
        """The sign-in form (straight on to the inbox for an open server or a signed-in one)."""
        viewer = self.kit.anonymous(request)
        target = safe_next(query_of(request).get("next"))
        if self.kit.auth is None or viewer.principal is not None:
            return self.kit.redirect(request, viewer, target)
        return self._login_page(request, viewer, target, problem=None, status=200)

    async def login(self, request: Request) -> Response:
        """Exchange the submitted token for a signed-in session."""
        viewer = self.kit.anonymous(request)
        try:
            form = await self.kit.form(request)
            self.kit.check_csrf(request, viewer, form)
        except CsrfRefusedError:
            return self.kit.csrf_refused(request)
        except AgentError as error:
            return self.kit.agent_error(request, viewer, error)
        target = safe_next(form.get("next"))
        if self.kit.auth is None:
            return self.kit.redirect(request, viewer, target)
        try:
            principal = await exchange_token(self.kit.auth, request, form.get("token", "").strip())
        except AgentError as refused:
            # The authenticator's own wording may name the token's form; keep it generic.
            problem = (
                "That token was not accepted."
                if refused.status == "UNAUTHENTICATED"
                else refused.message
            )
            return self._login_page(request, viewer, target, problem=problem, status=401)
        signed_in = Viewer(
            session=self.kit.cookies.new(principal), principal=principal, open_server=False
        )
        return self.kit.redirect(request, signed_in, target)

    async def logout(self, request: Request) -> Response:
        """End the session: the cookie is cleared (only with this session's CSRF token)."""
        try:
            viewer = self.kit.viewer(request)
        except NotSignedInError:
            return self.kit.redirect(request, None, "/ui/login")
        try:
            form = await self.kit.form(request)
            self.kit.check_csrf(request, viewer, form)
        except CsrfRefusedError:
            return self.kit.csrf_refused(request)
        except AgentError as error:
            return self.kit.agent_error(request, viewer, error)
        response = self.kit.redirect(request, None, "/ui/login" if self.kit.auth else "/ui")
        self.kit.cookies.clear(response, request)
        return response
