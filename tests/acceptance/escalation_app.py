"""The app and authenticator of the escalation browser test.

``--app tests.acceptance.escalation_app:ai``: the banking example whose ``userApproval`` is
assigned to group ``payments``, escalates to group ``leads`` when nobody decides it within
``TURNSTILE_TEST_ESCALATE_SECONDS`` (default 4), and reminds every second while open. With
``TURNSTILE_TEST_CHAIN_SECONDS=A,B`` it escalates along a chain instead: to ``leads`` A
seconds after it was asked, then to ``directors`` B seconds after that.
``--auth tests.acceptance.escalation_app:auth``: alice asks; paula is in payments, lena in
leads, dora in directors; all hold ``approver`` (the server runs with ``--inbox-policy
role:approver``).
"""

from __future__ import annotations

import os

from engine.escalation import escalation_chain
from engine.remote.auth import BearerTokenAuth, Principal
from examples.banking import ai, user_approval

__all__ = ["TOKENS", "ai", "auth"]

TOKENS = {
    "alice": "alice-escalation-token-0123456789",
    "paula": "paula-escalation-token-0123456789",
    "lena": "lena-escalation-token-0123456789",
    "dora": "dora-escalation-token-0123456789",
}
GROUPS = {"alice": "requesters", "paula": "payments", "lena": "leads", "dora": "directors"}

user_approval.group = "payments"
user_approval.remind_every = 1.0
# "5,10": to leads 5 s after the approval is asked, to directors 10 s after that.
_chain_waits = os.environ.get("TURNSTILE_TEST_CHAIN_SECONDS", "").split(",")
user_approval.escalation = escalation_chain(
    user_approval.name,
    {"escalate": list(zip(("leads", "directors"), map(float, _chain_waits), strict=True))}
    if _chain_waits != [""]
    else {"escalate": "leads"},
    timeout=float(os.environ.get("TURNSTILE_TEST_ESCALATE_SECONDS", "4")),
)

auth = BearerTokenAuth(
    {
        token: Principal(id=who, roles=frozenset({"approver", GROUPS[who]}))
        for who, token in TOKENS.items()
    }
)
