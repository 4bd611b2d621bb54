"""Who is calling: pluggable authentication, and who may decide which approvals.

An :data:`Authenticator` receives the Starlette request and returns the caller's
:class:`Principal`, or raises :class:`UnauthenticatedError` (HTTP 401). Sessions belong to the
principal that created them; another principal's sessions look like they do not exist (404).
:class:`BearerTokenAuth` ships for the common case; anything else (JWT, mTLS headers set by a
proxy, a session cookie) is a small async callable.

An :class:`InboxPolicy` decides which open approvals a principal sees and may decide: by
default, those of its own sessions; :class:`RoleInboxPolicy` lets a role (e.g. ``approver``)
decide every approval. :func:`inbox_policy_from_spec` reads one from a command-line spec
(``owner``, ``role:NAME`` or ``module:attribute``).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from starlette.requests import Request

from engine.errors import AgentError
from engine.remote.imports import import_attribute
from engine.store import PendingApproval

__all__ = [
    "Authenticator",
    "BearerTokenAuth",
    "InboxPolicy",
    "OwnerInboxPolicy",
    "PermissionDeniedError",
    "Principal",
    "RoleInboxPolicy",
    "UnauthenticatedError",
    "inbox_policy_from_spec",
    "is_demo_only",
]


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: ``id`` is what sessions record as their owner."""

    id: str
    roles: frozenset[str] = field(default_factory=frozenset)


class UnauthenticatedError(AgentError):
    """No or bad credentials (HTTP 401)."""

    default_status = "UNAUTHENTICATED"


class PermissionDeniedError(AgentError):
    """Authenticated, but not allowed to do this (HTTP 403)."""

    default_status = "PERMISSION_DENIED"


#: ``async (request) -> Principal``; raises :class:`UnauthenticatedError` to refuse.
Authenticator = Callable[[Request], Awaitable[Principal]]


class BearerTokenAuth:
    """``Authorization: Bearer <token>`` checked against a fixed table of tokens.

    ``tokens`` maps each token to its principal (or to a principal id). Tokens are compared in
    constant time so response timing does not leak how much of a guess was right.
    ``demo_only=True`` marks tokens that are published (an example's): ``turnstile serve``
    refuses such an authenticator unless ``--dev`` (see :func:`is_demo_only`).
    """

    def __init__(self, tokens: Mapping[str, Principal | str], *, demo_only: bool = False) -> None:
        if not tokens:
            raise ValueError("BearerTokenAuth needs at least one token.")
        self.demo_only = demo_only
        self._tokens = [
            (token.encode(), who if isinstance(who, Principal) else Principal(id=who))
            for token, who in tokens.items()
        ]

    async def __call__(self, request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthenticatedError(
                "Missing bearer token: send 'Authorization: Bearer <token>'."
            )
        offered = token.strip().encode()
        found: Principal | None = None
        for known, principal in self._tokens:
            # No early exit: every token is compared, matching or not.
            if hmac.compare_digest(known, offered):
                found = principal
        if found is None:
            raise UnauthenticatedError("Invalid bearer token.")
        return found


def is_demo_only(authenticator: object) -> bool:
    """Whether ``authenticator`` says its credentials are published, so that it may guard
    only a local demo: any authenticator may carry a ``demo_only = True`` attribute (as
    :class:`BearerTokenAuth` does when built with ``demo_only=True``)."""
    return getattr(authenticator, "demo_only", False) is True


@runtime_checkable
class InboxPolicy(Protocol):
    """Which approvals a principal may see and decide."""

    def owner_filter(self, principal: Principal | None) -> str | None:
        """Restrict listings to sessions of this owner (``None``: no restriction)."""
        ...

    def can_decide(self, principal: Principal | None, approval: PendingApproval) -> bool:
        """Whether ``principal`` may see and decide ``approval``."""
        ...


class OwnerInboxPolicy:
    """The default: a principal sees and decides the approvals of its own sessions.

    Without authentication (``principal is None``) every approval is visible.
    """

    def owner_filter(self, principal: Principal | None) -> str | None:
        return principal.id if principal is not None else None

    def can_decide(self, principal: Principal | None, approval: PendingApproval) -> bool:
        return principal is None or approval.owner == principal.id


class RoleInboxPolicy(OwnerInboxPolicy):
    """Principals holding ``role`` see and decide every approval; others only their own."""

    def __init__(self, role: str = "approver") -> None:
        self.role = role

    def owner_filter(self, principal: Principal | None) -> str | None:
        if principal is not None and self.role in principal.roles:
            return None
        return super().owner_filter(principal)

    def can_decide(self, principal: Principal | None, approval: PendingApproval) -> bool:
        if principal is not None and self.role in principal.roles:
            return True
        return super().can_decide(principal, approval)


_POLICY_FORMS = (
    "'owner' (a principal decides its own sessions' approvals), 'role:NAME' (principals "
    "holding role NAME decide every approval, others their own) or 'module:attribute' (an "
    "InboxPolicy, or a class or function without arguments making one, importable from the "
    "current directory)"
)


def inbox_policy_from_spec(spec: str) -> InboxPolicy:
    """The inbox policy a command-line spec names (``turnstile serve --inbox-policy``).

    ``owner`` is :class:`OwnerInboxPolicy`; ``role:NAME`` is :class:`RoleInboxPolicy` with
    role ``NAME`` (so a module named ``role`` cannot be named); anything else is read as
    ``module:attribute``, imported from the current directory: an object with
    ``owner_filter`` and ``can_decide``, or a class or function that makes one when called
    without arguments. Raises :class:`ValueError` naming the accepted forms otherwise.
    """
    text = spec.strip()
    if text == "owner":
        return OwnerInboxPolicy()
    kind, separator, rest = text.partition(":")
    if kind == "role" and separator:
        if not rest or any(c.isspace() for c in rest):
            raise ValueError(
                f"Inbox policy {spec!r} names no usable role (a role is a non-empty name "
                f"without spaces); use {_POLICY_FORMS}."
            )
        return RoleInboxPolicy(role=rest)
    if not separator or not kind or not rest:
        raise ValueError(f"Inbox policy {spec!r} is not one of {_POLICY_FORMS}.")
    return _imported_policy(spec, kind, rest)


def _imported_policy(spec: str, module_name: str, attribute: str) -> InboxPolicy:
    """``module:attribute`` as an :class:`InboxPolicy` (made by calling it when needed)."""
    try:
        found: Any = import_attribute(module_name, attribute)
    except ImportError as exc:
        raise ValueError(
            f"Inbox policy {spec!r}: cannot import module {module_name!r} ({exc}); use "
            f"{_POLICY_FORMS}."
        ) from exc
    except AttributeError as exc:
        raise ValueError(
            f"Inbox policy {spec!r}: module {module_name!r} has no attribute {attribute!r}; "
            f"use {_POLICY_FORMS}."
        ) from exc
    # A class has the protocol's methods as attributes too: it is made, not used as is.
    if isinstance(found, type) or (callable(found) and not isinstance(found, InboxPolicy)):
        try:
            found = found()
        except TypeError as exc:
            raise ValueError(
                f"Inbox policy {spec!r} could not be made without arguments ({exc}); use "
                f"{_POLICY_FORMS}."
            ) from exc
    if not isinstance(found, InboxPolicy):
        raise ValueError(
            f"Inbox policy {spec!r} is a {type(found).__name__}, which has no owner_filter and "
            f"can_decide methods; use {_POLICY_FORMS}."
        )
    return found
