"""Two versions of the payments app's client-managed agent, for the pinned-state tests.

``paymentsStateless`` keeps its sessions in signed blobs on the client. ``v1``, ``v2`` and
``v2_migrating`` (v2 registering the migration from v1) are what three ``turnstile serve``
processes serve: a blob paused under v1 is then resumed against a later deploy. The two
definitions differ as :mod:`tests.acceptance.versioned_app`'s do.
"""

from __future__ import annotations

from engine import Engine
from stores.settings import current_settings
from tests.acceptance.versioned_app import (
    INTERRUPT,
    Decision,
    SignedModel,
    TransferV1,
    TransferV2,
    rename_approval,
)

__all__ = ["AGENT", "build", "v1", "v2", "v2_migrating"]

AGENT = "paymentsStateless"


def build(version: str, *, migration: bool = False) -> Engine:
    """The client-managed app at ``version`` (``v1`` or ``v2``), signing with the keys of the
    process's settings as `turnstile serve` hands them (the three processes share them)."""
    keys = current_settings().state_keys
    ai = Engine(model=SignedModel(version), version=version, state_keys=keys)
    approval = ai.define_interrupt(name=INTERRUPT[version], output_schema=Decision)
    transfer = ai.define_tool(
        name="transfer",
        input_schema=TransferV1 if version == "v1" else TransferV2,
        fn=lambda _: {"ok": True},
    )
    system = "Move money when asked." if version == "v1" else "Move money; confirm first."
    ai.define_agent(name=AGENT, system=system, tools=[approval, transfer], max_turns=3)
    if migration:
        ai.migrate(from_version="v1")(rename_approval)
    return ai


v1 = build("v1")
v2 = build("v2")
v2_migrating = build("v2", migration=True)
