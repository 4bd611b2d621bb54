"""The app the operator CLI's acceptance tests run: ``--app tests.acceptance.operator_app:ai``.

The banking example's interrupt and tool on one durable agent, ``opsAgent``, whose store is on
``TURNSTILE_DATABASE_URL`` (exported by ``turnstile worker`` and the operator commands before
the import). Its model is the scripted one, except while the file named by
``TEST_MODEL_OUTAGE`` exists: then every model call fails with a non-transient error, so a
test can make a batch of turns fail and, once the file is gone, retry them. Each transfer is
booked under its idempotency key in the ledger ``TEST_LEDGER`` (when set), so a test can see
that a fork or a retry never repeats one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from engine import Engine, ScriptedModel, ToolContext
from engine.model import ChunkSink, ModelRequest, ModelResponse
from engine.scripted import transaction_id
from engine.turns.executor import LeaseSettings
from examples.banking import (
    SYSTEM_PROMPT,
    ApprovalDecision,
    ApprovalRequest,
    TransferReceipt,
    TransferRequest,
    book,
)
from stores import SqlSessionStore

__all__ = ["AGENT", "OUTAGE_MESSAGE", "make_engine"]

AGENT = "opsAgent"
OUTAGE_MESSAGE = "model outage (test switch)"


class SwitchedModel:
    """The scripted model, failing while the outage file exists."""

    name = "scripted"

    def __init__(self, outage: Path | None) -> None:
        self.inner = ScriptedModel()
        self.outage = outage

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """The scripted answer, or a failure during an outage."""
        if self.outage is not None and self.outage.exists():
            raise RuntimeError(OUTAGE_MESSAGE)
        return await self.inner.generate(request, on_chunk)


def make_engine(url: str, *, outage: Path | None = None, ledger: Path | None = None) -> Engine:
    """The engine with ``opsAgent`` on one :class:`SqlSessionStore` at ``url``."""
    ai = Engine(model=SwitchedModel(outage))

    def transfer(request: TransferRequest, ctx: ToolContext) -> TransferReceipt:
        """Book the transfer under its idempotency key."""
        if ledger is not None:
            book(ledger, ctx.idempotency_key, request)
        return TransferReceipt(
            success=True, transactionId=transaction_id(request.amount, request.toAccount)
        )

    transfer_money = ai.define_tool(
        name="transferMoney",
        description="Transfer money to a specified account.",
        input_schema=TransferRequest,
        output_schema=TransferReceipt,
        fn=transfer,
    )
    user_approval = ai.define_interrupt(
        name="userApproval",
        description="Ask the user for approval before a sensitive action.",
        input_schema=ApprovalRequest,
        output_schema=ApprovalDecision,
    )
    ai.define_agent(
        name=AGENT,
        system=SYSTEM_PROMPT,
        tools=[user_approval, transfer_money],
        store=SqlSessionStore(url),
        max_attempts=1,
        lease=LeaseSettings(lease_seconds=5, heartbeat_interval=1),
    )
    return ai


def _from_env() -> Engine:
    outage = os.environ.get("TEST_MODEL_OUTAGE")
    ledger = os.environ.get("TEST_LEDGER")
    return make_engine(
        os.environ["TURNSTILE_DATABASE_URL"],
        outage=Path(outage) if outage else None,
        ledger=Path(ledger) if ledger else None,
    )


_built: dict[str, Engine] = {}


def __getattr__(name: str) -> Any:
    # Built on first access, so importing the module does not open a store.
    if name == "ai":
        if "ai" not in _built:
            _built["ai"] = _from_env()
        return _built["ai"]
    raise AttributeError(name)
