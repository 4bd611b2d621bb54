"""The app and authenticator of the approval-policy browser test.

``--app tests.acceptance.policy_app:ai``: the banking example (ledger and database as
``examples.banking`` reads them from the environment) whose ``userApproval`` needs two
distinct principals holding ``approver``, never the requester. ``--auth
tests.acceptance.policy_app:auth``: alice asks; alice, bob and carol all hold ``approver``, and
so do ``Alice`` and a full-width ``bob``, whose ids differ from alice's and bob's only in case
or width.
"""

from __future__ import annotations

from engine.approval_policy import ApprovalPolicy, role
from engine.remote.auth import BearerTokenAuth, Principal
from examples.banking import ai, user_approval

__all__ = ["TOKENS", "ai", "auth"]

TOKENS = {
    "alice": "alice-policy-token-0123456789",
    "bob": "bob-policy-token-0123456789",
    "carol": "carol-policy-token-0123456789",
    # Accounts whose ids only look different: the same people to maker-checker and quorum.
    "Alice": "alice-upper-policy-token-0123456789",
    "\uff42ob": "bob-fullwidth-policy-token-0123456789",
}

user_approval.approval_policy = ApprovalPolicy(approvers=role("approver"), required_approvals=2)

auth = BearerTokenAuth(
    {token: Principal(id=who, roles=frozenset({"approver"})) for who, token in TOKENS.items()}
)
