"""Wrapping a page handler: resolve the viewer, and turn refusals into pages.

Every handler receives the :class:`~engine.remote.ui.kit.Viewer`; a browser that must sign in
first is sent to the login page, a forged form gets 403, and an engine error gets its own
status (a 4xx for bad input) with a page that says what went wrong.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import AgentError
from engine.remote.ui.kit import CsrfRefusedError, NotSignedInError, PageKit, Viewer
from engine.remote.wire import client_error, http_status

__all__ = ["Endpoint", "Handler", "guarded", "guarded_json"]

Handler = Callable[[Request, Viewer], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def guarded(kit: PageKit, handler: Handler) -> Endpoint:
    """An endpoint for a page (HTML answers, a redirect to sign in)."""

    async def endpoint(request: Request) -> Response:
        # Another site's page posting here is refused before anything else is looked at.
        if request.method == "POST" and kit.cross_site(request):
            return kit.csrf_refused(request)
        if kit.arrived_from_another_site(request):
            return kit.same_site_again(request)
        try:
            viewer = await kit.viewer(request)
        except NotSignedInError:
            return kit.not_signed_in(request)
        try:
            return await handler(request, viewer)
        except CsrfRefusedError:
            return kit.csrf_refused(request)
        except AgentError as error:
            return kit.agent_error(request, viewer, error)

    return endpoint


def guarded_json(kit: PageKit, handler: Handler) -> Endpoint:
    """An endpoint a page's script polls (JSON answers, 401 when the session ended)."""

    async def endpoint(request: Request) -> Response:
        try:
            viewer = await kit.viewer(request)
        except NotSignedInError:
            anonymous = kit.cookie_viewer(request)
            body = {"status": "UNAUTHENTICATED", "message": "Sign in again."}
            return kit.json(request, anonymous, body, status=401)
        try:
            return await handler(request, viewer)
        except AgentError as error:
            shown = client_error(error)
            return kit.json(request, viewer, shown.to_wire(), status=http_status(shown))

    return endpoint
