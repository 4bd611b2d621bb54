"""The app of the webhook acceptance test: the escalation app (:mod:`escalation_app`: group
``payments``, escalation to ``leads`` after ``TURNSTILE_TEST_ESCALATE_SECONDS``) whose
``userApproval`` also tells the receiver at ``TURNSTILE_TEST_WEBHOOK_URL`` (signed with
``TURNSTILE_TEST_WEBHOOK_SECRET``) about every approval event, reminding every 2 seconds.

``--app tests.acceptance.webhook_app:ai --auth tests.acceptance.escalation_app:auth``.
"""

from __future__ import annotations

import os

from engine.webhooks import Webhook
from examples.banking import user_approval
from tests.acceptance.escalation_app import ai

__all__ = ["ai"]

user_approval.remind_every = 2.0
user_approval.webhooks = ai.webhooks.add(
    [
        Webhook(
            url=os.environ["TURNSTILE_TEST_WEBHOOK_URL"],
            secret=os.environ["TURNSTILE_TEST_WEBHOOK_SECRET"],
        )
    ]
)
