"""The app and authenticator of the edit-before-approve browser test.

``--app tests.acceptance.edit_app:ai``: :mod:`examples.guarded_banking` (ledger and database
from the environment), whose editable ``transferMoney`` may be decided only by principals
holding ``approver``, never the requester. ``--auth tests.acceptance.edit_app:auth``: alice
asks; alice and bob hold ``approver``.
"""

from __future__ import annotations

from engine.approval_policy import ApprovalPolicy, role
from engine.remote.auth import BearerTokenAuth, Principal
from examples.guarded_banking import ai, app

__all__ = ["TOKENS", "ai", "auth"]

TOKENS = {
    "alice": "alice-edit-token-0123456789",
    "bob": "bob-edit-token-0123456789",
}

app.transfer_money.approval_policy = ApprovalPolicy(approvers=role("approver"))

auth = BearerTokenAuth(
    {token: Principal(id=who, roles=frozenset({"approver"})) for who, token in TOKENS.items()}
)
