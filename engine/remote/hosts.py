"""Which ``Host`` names the server answers to, against DNS rebinding.

A page on another origin can point its own name at 127.0.0.1 and then call a server on this
machine as that name: the browser believes it talks to the page's own site, so neither CORS
nor ``SameSite`` cookies stop it. An open server (no authenticator: the README's demo) would
then let that page decide and edit approvals. Refusing every ``Host`` the server was not
told to answer to closes that: the rebinding page's requests carry its own name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["LOCAL_HOSTS", "AllowedHosts", "host_allowed"]

#: The names a server with no authenticator answers to unless told otherwise.
LOCAL_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")


def _name_of(host: str) -> str:
    """The host name of a ``Host`` header value, without its port (``[::1]:8000`` → ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, _, _port = host.partition(":") if host.count(":") == 1 else (host, "", "")
    return name.rstrip(".")


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Whether ``host`` (a ``Host`` header's value) is one of ``allowed``: exact names, ``*``
    for any, or ``*.example.com`` for any subdomain of example.com."""
    name = _name_of(host)
    for pattern in allowed:
        pattern = pattern.strip().lower()
        if pattern == "*" or pattern == name:
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]):
            return True
    return False


class AllowedHosts:
    """ASGI middleware answering 400 to a request whose ``Host`` is not allowed, except on
    the paths in ``exempt`` (health probes and metrics, which change nothing and which an
    orchestrator calls by an address of its own)."""

    def __init__(self, app: ASGIApp, *, hosts: Sequence[str], exempt: Sequence[str] = ()) -> None:
        self.app = app
        self.hosts = tuple(hosts)
        self.exempt = tuple(exempt)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        host = Headers(scope=scope).get("host", "")
        if host_allowed(host, self.hosts):
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            {
                "status": "INVALID_ARGUMENT",
                "message": "This server does not answer to that Host name (see --allowed-hosts).",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
