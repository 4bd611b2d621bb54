"""Turnstile over HTTP: a server speaking Genkit's wire protocol, and a Python client.

``create_app(engine)`` is an ASGI app (``turnstile serve`` runs it with uvicorn);
``remote_agent(url)`` is an agent whose chats run on such a server. See ``docs/http.md``.
"""

from __future__ import annotations

from engine.remote.auth import (
    Authenticator,
    BearerTokenAuth,
    InboxPolicy,
    OwnerInboxPolicy,
    PermissionDeniedError,
    Principal,
    RoleInboxPolicy,
    UnauthenticatedError,
)
from engine.remote.server import DEFAULT_MAX_BODY_BYTES, create_app

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "Authenticator",
    "BearerTokenAuth",
    "InboxPolicy",
    "OwnerInboxPolicy",
    "PermissionDeniedError",
    "Principal",
    "RoleInboxPolicy",
    "UnauthenticatedError",
    "create_app",
]
