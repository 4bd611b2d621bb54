"""What a webhook is and what each request carries (engine.webhooks): the signature a receiver
checks, the Slack body, the retry schedule, and the configuration refused when it cannot work."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime

import pytest

from engine import Engine, ScriptedModel
from engine.store import WebhookDelivery
from engine.webhooks import (
    BACKOFF_BASE,
    BACKOFF_CAP,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Webhook,
    WebhookRoutes,
    backoff_delay,
    render_body,
    sign,
    signed_headers,
    verify,
)

SECRET = "whsec-unit-0123456789"
HOOK = Webhook(url="https://hooks.example/approvals", secret=SECRET)

PAYLOAD = {
    "event": "decided",
    "event_id": "t1:approval-1/decided",
    "approval_id": "t1:approval-1",
    "agent": "bankingAgent",
    "interrupt": "userApproval",
    "group": "payments",
    "assignee": None,
    "decided_by": "paula",
}


def delivery(body: str) -> WebhookDelivery:
    return WebhookDelivery(
        id="d1",
        event_id="t1:approval-1/decided",
        event="decided",
        turn_id="t1",
        round=1,
        ref="approval-1",
        url=HOOK.url,
        body=body,
        occurred_at=datetime(2026, 12, 6, tzinfo=UTC),
    )


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    """A receiver recomputes the signature from the documented recipe alone."""
    body = '{"event":"opened"}'
    expected = hmac.new(SECRET.encode(), f"1700000000.{body}".encode(), hashlib.sha256)
    assert sign(SECRET, 1700000000, body) == expected.hexdigest()


def test_signed_headers_verify_and_carry_stable_ids() -> None:
    """The headers of an attempt verify with the secret and name the delivery and event."""
    sent = delivery(render_body("json", PAYLOAD))
    headers = signed_headers(SECRET, sent, 1700000000)
    assert verify(
        SECRET, headers[TIMESTAMP_HEADER], sent.body, headers[SIGNATURE_HEADER], now=1700000010
    )
    assert headers["Turnstile-Delivery"] == "d1"
    assert headers["Turnstile-Event-Id"] == "t1:approval-1/decided"
    assert headers["Turnstile-Event"] == "decided"


def test_verification_refuses_a_changed_body_another_secret_or_an_old_timestamp() -> None:
    """Tampering, the wrong secret and a replay outside the tolerance all fail."""
    body = render_body("json", PAYLOAD)
    good = f"v1={sign(SECRET, 1700000000, body)}"
    assert verify(SECRET, "1700000000", body, good, now=1700000000)
    assert not verify(SECRET, "1700000000", body + " ", good, now=1700000000)
    assert not verify("another-secret", "1700000000", body, good, now=1700000000)
    assert not verify(SECRET, "1700000000", body, good, now=1700000000 + 301)
    assert not verify(SECRET, "not-a-number", body, good, now=1700000000)


def test_the_json_body_is_the_event_itself() -> None:
    """format="json" sends the event's fields as one JSON object."""
    assert json.loads(render_body("json", PAYLOAD)) == PAYLOAD


def test_the_slack_body_is_an_incoming_webhook_message_with_the_event() -> None:
    """format="slack" sends text and a mrkdwn section naming the approval and the decider,
    and keeps the event's fields for a receiver that wants them."""
    slack = json.loads(render_body("slack", PAYLOAD))
    assert "Approval decided" in slack["text"]
    assert "`t1:approval-1`" in slack["text"] and "paula" in slack["text"]
    assert slack["blocks"] == [
        {"type": "section", "text": {"type": "mrkdwn", "text": slack["text"]}}
    ]
    assert slack["turnstile"] == PAYLOAD


def test_the_backoff_doubles_up_to_its_cap_within_its_upper_half() -> None:
    """Attempt n waits between half and all of base·2^(n-1), capped; jitter picks the point."""
    low = [backoff_delay(n, jitter=lambda: 0.0) for n in range(1, 6)]
    high = [backoff_delay(n, jitter=lambda: 1.0) for n in range(1, 6)]
    ceilings = [BACKOFF_BASE * 2 ** (n - 1) for n in range(1, 6)]
    assert high == ceilings
    assert low == [c / 2 for c in ceilings]
    assert backoff_delay(40, jitter=lambda: 1.0) == BACKOFF_CAP


def test_a_webhook_refuses_what_could_not_be_delivered() -> None:
    """A non-http URL, an empty secret, unknown events or an unknown format are refused."""
    with pytest.raises(ValueError, match="http"):
        Webhook(url="ftp://hooks.example/x", secret=SECRET)
    with pytest.raises(ValueError, match="secret"):
        Webhook(url=HOOK.url, secret="")
    with pytest.raises(ValueError, match="events"):
        Webhook(url=HOOK.url, secret=SECRET, events=frozenset({"paid"}))
    with pytest.raises(ValueError, match="format"):
        Webhook(url=HOOK.url, secret=SECRET, format="xml")  # type: ignore[arg-type]
    assert SECRET not in repr(HOOK)


def test_routes_join_an_interrupts_webhooks_with_its_groups_each_url_once() -> None:
    """An event goes to the interrupt's webhooks then the group's, each endpoint once, and only
    to those that asked for it."""
    lead = Webhook(
        url="https://hooks.example/leads", secret=SECRET, events=frozenset({"escalated"})
    )
    routes = WebhookRoutes({"leads": [lead, HOOK]})
    assert routes.endpoints([HOOK], "leads", "escalated") == [HOOK, lead]
    assert routes.endpoints([HOOK], "leads", "opened") == [HOOK]
    assert routes.endpoints([], None, "opened") == []
    assert routes.endpoint(lead.url) == lead


def test_one_url_with_two_secrets_is_refused() -> None:
    """Deliveries are signed by the secret looked up by URL: two secrets for one URL would be
    ambiguous, so the engine refuses the second definition."""
    ai = Engine(model=ScriptedModel(), webhooks={"payments": [HOOK]})
    twin = Webhook(url=HOOK.url, secret="another-secret-0123")
    with pytest.raises(ValueError, match="configured twice"):
        ai.define_interrupt(name="ask", webhooks=[twin])
    same = ai.define_interrupt(name="ask2", webhooks=[HOOK])
    assert same.webhooks == (HOOK,)
