"""Signing in and out of the inbox UI.

The login form's token goes to the server's authenticator as a bearer token would; the
principal it names gets a new session row (a new CSRF token with it, so a token seen before
signing in is worth nothing after), whose id the signed cookie carries. The login form carries
a CSRF token too, so another site cannot sign a browser in as someone else. Failed sign-ins
are limited per client address and per account named (:mod:`.login_limits`): past the limit
the form answers 429 with ``Retry-After``. Signing out revokes the row, so a copy of the
cookie kept elsewhere stops working too.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import AgentError
from engine.remote.logsafe import escaped
from engine.remote.ui.kit import (
    CsrfRefusedError,
    NotSignedInError,
    PageKit,
    Viewer,
    query_of,
    safe_next,
)
from engine.remote.ui.login_limits import LoginAttempt, report_failure
from engine.remote.ui.sessions import client_address, exchange_token

__all__ = ["AuthPages"]

logger = logging.getLogger("turnstile.ui")

_NOT_ACCEPTED = "That token was not accepted."


class AuthPages:
    """``GET``/``POST /ui/login`` and ``POST /ui/logout``."""

    def __init__(self, kit: PageKit) -> None:
        self.kit = kit

    def _login_page(
        self,
        request: Request,
        viewer: Viewer,
        target: str,
        *,
        problem: str | None,
        status: int,
        account: str = "",
    ) -> Response:
        seconds = self.kit.cookies.session_seconds
        length = f"{seconds // 3600} hours" if seconds >= 7200 else f"{seconds // 60} minutes"
        context = {
            "nav": "",
            "next": target,
            "problem": problem,
            "session_length": length,
            "account": account,
        }
        return self.kit.page(request, viewer, "login.html", context, status=status)

    async def _checked_form(self, request: Request, viewer: Viewer) -> dict[str, str] | Response:
        """The posted form, or the page refusing it: forged (403) or unreadable (its error)."""
        # Login and logout answer browsers that are not signed in, so no guard refuses for them.
        try:
            form = await self.kit.form(request)
            self.kit.check_csrf(request, viewer, form)
        except CsrfRefusedError:
            return self.kit.csrf_refused(request)
        except AgentError as error:
            return self.kit.agent_error(request, viewer, error)
        return form

    async def login_form(self, request: Request) -> Response:
        """The sign-in form (straight on to the inbox for an open server or a signed-in one)."""
        if self.kit.arrived_from_another_site(request):
            return self.kit.same_site_again(request)
        viewer = await self.kit.anonymous(request)
        target = safe_next(query_of(request).get("next"))
        if self.kit.auth is None or viewer.principal is not None:
            return self.kit.redirect(request, viewer, target)
        return self._login_page(request, viewer, target, problem=None, status=200)

    async def login(self, request: Request) -> Response:
        """Exchange the submitted token for a signed-in session (429 past the limit)."""
        viewer = await self.kit.anonymous(request)
        form = await self._checked_form(request, viewer)
        if isinstance(form, Response):
            return form
        target = safe_next(form.get("next"))
        if self.kit.auth is None:
            return self.kit.redirect(request, viewer, target)
        account = form.get("account", "").strip()
        address = client_address(request)
        try:
            attempt = await self.kit.login_limiter.attempt(address, account or None)
        except Exception:
            # Without the counters nobody can be limited: refuse rather than let guesses by.
            logger.exception("UI sign-in refused: the sign-in counters could not be written")
            return self.kit.error(
                request,
                viewer,
                503,
                "Sign-in unavailable",
                "Signing in is not possible right now; try again in a minute.",
            )
        if attempt.limited:
            return self._limited(request, viewer, target, attempt, address, account)
        try:
            principal = await exchange_token(self.kit.auth, request, form.get("token", "").strip())
        except AgentError as refused:
            # The authenticator's own wording may name the token's form; keep it generic.
            problem = _NOT_ACCEPTED if refused.status == "UNAUTHENTICATED" else refused.message
            return self._refused(request, viewer, target, problem, address, account)
        if account and account != principal.id:
            # The token is good but not the named account's: a failure like any other.
            return self._refused(request, viewer, target, _NOT_ACCEPTED, address, account)
        await self.kit.login_limiter.succeeded(attempt, principal.id)
        session = await self.kit.sessions.sign_in(principal, request)
        signed_in = Viewer(session=session, principal=principal, open_server=False)
        return self.kit.redirect(request, signed_in, target)

    def _refused(
        self,
        request: Request,
        viewer: Viewer,
        target: str,
        problem: str,
        address: str,
        account: str,
    ) -> Response:
        logger.warning(
            "UI sign-in refused from %s (account %s)", escaped(address), escaped(account or "-")
        )
        report_failure("refused")
        return self._login_page(
            request, viewer, target, problem=problem, status=401, account=account
        )

    def _limited(
        self,
        request: Request,
        viewer: Viewer,
        target: str,
        attempt: LoginAttempt,
        address: str,
        account: str,
    ) -> Response:
        logger.warning(
            "UI sign-in from %s (account %s) refused: too many failed sign-ins; retry in %ds",
            escaped(address),
            escaped(account or "-"),
            attempt.retry_after,
        )
        report_failure("limited")
        minutes = max(1, -(-attempt.retry_after // 60))
        problem = (
            "Too many failed sign-ins from this address or for this account. "
            f"Try again in {minutes} minute{'s' if minutes != 1 else ''}."
        )
        response = self._login_page(
            request, viewer, target, problem=problem, status=429, account=account
        )
        response.headers["retry-after"] = str(attempt.retry_after)
        return response

    async def logout(self, request: Request) -> Response:
        """End the session: its row is revoked and the cookie cleared (only with this
        session's CSRF token)."""
        try:
            viewer = await self.kit.viewer(request)
        except NotSignedInError:
            return self.kit.redirect(request, None, "/ui/login")
        form = await self._checked_form(request, viewer)
        if isinstance(form, Response):
            return form
        await self.kit.sessions.sign_out(viewer.session)
        response = self.kit.redirect(request, None, "/ui/login" if self.kit.auth else "/ui")
        self.kit.cookies.clear(response, request)
        return response
