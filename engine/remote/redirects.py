"""Redirects that never name a host.

Starlette answers a path that only a trailing slash separates from a route (``/inbox/``)
with a redirect to the absolute URL it rebuilds from the request's ``Host`` header. That
header is the client's to choose, so a forged one would come back in ``Location`` (a cache
or a proxy in front of the server could then send other clients elsewhere). The server's
redirects are relative instead: the path and query only, resolved by the client against the
URL it asked for.
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.applications import Starlette
from starlette.responses import RedirectResponse
from starlette.routing import Match, Router
from starlette.types import Receive, Scope, Send

__all__ = ["relative_slash_redirects", "slash_twin_location"]


def slash_twin_location(router: Router, scope: Scope) -> str | None:
    """The relative location of the route a trailing slash more or less would reach, or
    ``None`` when there is none (or when it would read as another host: ``//host``)."""
    path: str = scope["path"]
    if scope["type"] != "http" or path == scope.get("root_path", "") + "/":
        return None
    twin = path.rstrip("/") if path.endswith("/") else path + "/"
    # "//host/x" is a network-path reference: a browser would leave this server for it.
    if not twin.startswith("/") or twin.startswith("//"):
        return None
    twin_scope = {**scope, "path": twin}
    if not any(route.matches(twin_scope)[0] != Match.NONE for route in router.routes):
        return None
    location = quote(twin, safe="/")
    query = scope.get("query_string", b"")
    return f"{location}?{query.decode('latin-1')}" if query else location


def relative_slash_redirects(app: Starlette) -> None:
    """Make ``app`` redirect between slash twins with relative locations (never the Host)."""
    router = app.router
    router.redirect_slashes = False
    not_found = router.default

    async def redirect_or_not_found(scope: Scope, receive: Receive, send: Send) -> None:
        location = slash_twin_location(router, scope)
        if location is None:
            await not_found(scope, receive, send)
            return
        await RedirectResponse(location)(scope, receive, send)

    router.default = redirect_or_not_found
