"""Outgoing webhooks about approvals, as configured: :class:`Webhook` endpoints, the engine's
:class:`WebhookRoutes`, and what every request carries — its signature (:func:`sign`,
:func:`verify`), its body (:func:`render_body`) — with the retry schedule
(:func:`backoff_delay`). What is sent when, and how, is :mod:`engine.approvals.webhooks`'s.

Every request is signed: ``Turnstile-Signature: v1=<hex>`` is HMAC-SHA256 of
``"{timestamp}.{body}"`` with the endpoint's secret, ``Turnstile-Timestamp`` the Unix seconds
signed, and ``Turnstile-Delivery`` / ``Turnstile-Event-Id`` stable ids a receiver uses to
drop a repeat (docs/webhooks.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from engine.store import WebhookDelivery, WebhookEvent

__all__ = [
    "BACKOFF_BASE",
    "BACKOFF_CAP",
    "DELIVERY_HEADER",
    "EVENTS",
    "EVENT_HEADER",
    "EVENT_ID_HEADER",
    "MAX_ATTEMPTS",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "BodyFormat",
    "Webhook",
    "WebhookEvent",
    "WebhookRoutes",
    "backoff_delay",
    "render_body",
    "sign",
    "signed_headers",
    "verify",
]

BodyFormat = Literal["json", "slack"]

#: Every event a webhook can ask for.
EVENTS: tuple[WebhookEvent, ...] = get_args(WebhookEvent)

SIGNATURE_HEADER = "Turnstile-Signature"
TIMESTAMP_HEADER = "Turnstile-Timestamp"
DELIVERY_HEADER = "Turnstile-Delivery"
EVENT_HEADER = "Turnstile-Event"
EVENT_ID_HEADER = "Turnstile-Event-Id"

#: Attempts at one delivery before it is marked ``failed``.
MAX_ATTEMPTS = 10
#: The first retry's delay and the longest, in seconds.
BACKOFF_BASE = 2.0
BACKOFF_CAP = 600.0


@dataclass(frozen=True)
class Webhook:
    """An endpoint to tell about approvals: ``url`` (http or https), the ``secret`` every
    request is signed with, the ``events`` it wants (default all of :data:`EVENTS`) and the
    body ``format``: ``"json"`` (the event as a JSON object) or ``"slack"`` (a Slack incoming
    webhook's ``text`` and ``blocks``)."""

    url: str
    secret: str = field(repr=False)
    events: frozenset[str] = frozenset(EVENTS)
    format: BodyFormat = "json"

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"A webhook URL must be http(s)://host/...: got {self.url!r}.")
        if not self.secret:
            raise ValueError(f"The webhook {self.url} needs a secret to sign its requests.")
        events = frozenset(self.events)
        unknown = sorted(events - set(EVENTS))
        if unknown or not events:
            raise ValueError(
                f"A webhook's events are some of {', '.join(EVENTS)}: got {sorted(events)}."
            )
        object.__setattr__(self, "events", events)
        if self.format not in get_args(BodyFormat):
            raise ValueError(f"A webhook's format is 'json' or 'slack': got {self.format!r}.")


class WebhookRoutes:
    """The engine's webhooks: the groups' (``Engine(webhooks=...)``) and, by URL, every
    webhook configured anywhere (a delivery's secret is looked up here when it is sent)."""

    def __init__(self, groups: Mapping[str, Sequence[Webhook]] | None = None) -> None:
        self.groups: dict[str, tuple[Webhook, ...]] = {}
        self._by_url: dict[str, Webhook] = {}
        for group, hooks in (groups or {}).items():
            if not group.strip():
                raise ValueError("Group webhooks are keyed by a group (a role) name.")
            self.groups[group] = self.add(hooks)

    def add(self, hooks: Iterable[Webhook]) -> tuple[Webhook, ...]:
        """Know ``hooks`` by URL; ``ValueError`` for a URL configured twice differently (its
        deliveries would not know which secret signs them)."""
        added = tuple(hooks)
        for hook in added:
            if not isinstance(hook, Webhook):
                raise TypeError(f"Expected a Webhook, got {type(hook).__name__}.")
            known = self._by_url.setdefault(hook.url, hook)
            if (known.secret, known.format) != (hook.secret, hook.format):
                raise ValueError(
                    f"The webhook {hook.url} is configured twice with another secret or format."
                )
        return added

    def endpoint(self, url: str) -> Webhook | None:
        """The webhook configured for ``url`` (``None``: no longer configured)."""
        return self._by_url.get(url)

    @property
    def urls(self) -> list[str]:
        """Every configured endpoint's URL."""
        return sorted(self._by_url)

    @property
    def any(self) -> bool:
        """Whether any webhook is configured."""
        return bool(self._by_url)

    def endpoints(self, own: Sequence[Webhook], group: str | None, event: str) -> list[Webhook]:
        """Who hears ``event`` about an approval whose tool has the webhooks ``own`` and
        which is assigned to ``group``: ``own``, then the group's, each URL once."""
        found: dict[str, Webhook] = {}
        for hook in (*own, *self.groups.get(group or "", ())):
            if event in hook.events:
                found.setdefault(hook.url, hook)
        return list(found.values())


def sign(secret: str, timestamp: int, body: str) -> str:
    """The hex HMAC-SHA256 of ``"{timestamp}.{body}"`` with ``secret``."""
    message = f"{timestamp}.{body}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(
    secret: str,
    timestamp: str,
    body: str,
    signature: str,
    *,
    tolerance: float = 300.0,
    now: float | None = None,
) -> bool:
    """Whether ``signature`` (the ``Turnstile-Signature`` header) signs ``body`` at
    ``timestamp`` (the ``Turnstile-Timestamp`` header) with ``secret``, and the timestamp is
    within ``tolerance`` seconds of ``now`` (a replayed old request fails)."""
    try:
        stamp = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - stamp) > tolerance:
        return False
    expected = f"v1={sign(secret, stamp, body)}"
    return hmac.compare_digest(expected, signature.strip())


def signed_headers(secret: str, delivery: WebhookDelivery, timestamp: int) -> dict[str, str]:
    """The headers of one attempt at ``delivery``, signed at ``timestamp`` (Unix seconds)."""
    return {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: f"v1={sign(secret, timestamp, delivery.body)}",
        DELIVERY_HEADER: delivery.id,
        EVENT_HEADER: delivery.event,
        EVENT_ID_HEADER: delivery.event_id,
    }


def backoff_delay(
    attempts: int,
    *,
    base: float = BACKOFF_BASE,
    cap: float = BACKOFF_CAP,
    jitter: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before the next attempt after ``attempts`` failed ones: doubling from
    ``base`` up to ``cap``, then a random point in its upper half, so endpoints that failed
    together do not retry in step."""
    ceiling = min(cap, base * 2.0 ** max(0, attempts - 1))
    return ceiling / 2 + jitter() * ceiling / 2


_HEADLINES: dict[str, str] = {
    "opened": "Approval needed",
    "reminded": "Still waiting for approval",
    "escalated": "Approval escalated",
    "decided": "Approval decided",
}


def render_body(format: BodyFormat, payload: Mapping[str, Any]) -> str:
    """The request body of ``payload`` in ``format``: the JSON object itself, or a Slack
    message (``text`` for notifications, ``blocks`` for the message, and the event under
    ``turnstile`` for a receiver that wants the fields)."""
    if format == "json":
        return json.dumps(payload, sort_keys=True, default=str)
    lines = [f"*{_HEADLINES[payload['event']]}*: `{payload['interrupt']}` of agent "]
    lines[0] += f"`{payload['agent']}` (approval `{payload['approval_id']}`)"
    if payload.get("group") or payload.get("assignee"):
        holder = payload.get("assignee") or f"group {payload['group']}"
        lines.append(f"Assigned to {holder}.")
    if payload["event"] == "escalated":
        lines.append(f"Escalated to group {payload.get('group')}.")
    if payload["event"] == "decided":
        lines.append(f"Decided by {payload.get('decided_by') or 'someone'}.")
    text = "\n".join(lines)
    slack = {
        "text": text,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
        "turnstile": dict(payload),
    }
    return json.dumps(slack, sort_keys=True, default=str)
