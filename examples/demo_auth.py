"""Sign-in for the README's local inbox demo: named bearer tokens anyone can read here.

``turnstile serve --auth examples.demo_auth:auth`` knows three people: Alice asks for
transfers, Bob holds the ``approver`` role (with ``--inbox-policy role:approver`` he sees and
decides every approval) and Carol is signed in but may decide only her own sessions'
approvals. The tokens are published in this file, so the authenticator is marked
``demo_only``: ``turnstile serve`` refuses it unless ``--dev`` is given. A deployment writes
its own authenticator (``docs/http.md``, "Authentication and ownership").
"""

from __future__ import annotations

from engine.remote.auth import BearerTokenAuth, Principal

#: Each demo user's bearer token (the API's ``Authorization: Bearer`` and the sign-in form's).
TOKENS = {
    "alice": "alice-demo-token",
    "bob": "bob-demo-token",
    "carol": "carol-demo-token",
}

auth = BearerTokenAuth(
    {
        TOKENS["alice"]: Principal(id="alice"),
        TOKENS["bob"]: Principal(id="bob", roles=frozenset({"approver"})),
        TOKENS["carol"]: Principal(id="carol"),
    },
    demo_only=True,
)
