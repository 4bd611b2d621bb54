"""The authenticator the inbox UI's acceptance tests give ``turnstile serve --auth``.

Alice asks for transfers, Bob holds the ``approver`` role (the server runs with
``--inbox-policy role:approver``), Mallory is signed in but may decide nothing of Alice's.
"""

from __future__ import annotations

from engine.remote.auth import BearerTokenAuth, Principal
from engine.store import PendingApproval

TOKENS = {
    "alice": "alice-token-0123456789",
    "bob": "bob-token-0123456789",
    "mallory": "mallory-token-0123456789",
}

auth = BearerTokenAuth(
    {
        TOKENS["alice"]: Principal(id="alice"),
        TOKENS["bob"]: Principal(id="bob", roles=frozenset({"approver"})),
        TOKENS["mallory"]: Principal(id="mallory"),
    }
)


class HidesAlicesApprovals:
    """An inbox permission hook no owner filter expresses: every signed-in principal sees
    every approval except those of Alice's sessions (``--inbox-policy`` with this module)."""

    def owner_filter(self, principal: Principal | None) -> str | None:
        return None

    def can_decide(self, principal: Principal | None, approval: PendingApproval) -> bool:
        return principal is not None and approval.owner != "alice"


hides_alices_approvals = HidesAlicesApprovals()
