"""A transfer tool that guards itself, and that approvers may edit before approving.

``transferMoney`` pauses on its first execution (``ctx.interrupt(...)``) and moves the money
only when an approver restarts it; it is declared ``editable=True``, so the approver may change
its arguments (the amount, the account) first. The model is the scripted one, except that a
request for a transfer calls ``transferMoney`` directly instead of asking ``userApproval``.

``--app examples.guarded_banking:ai`` serves the module-level app (configured by the
settings, and with the ledger, as ``examples.banking`` is); tests build their own with
:func:`build`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from engine import Agent, Engine, ScriptedModel, Tool, ToolContext
from engine.approval_policy import ApprovalPolicy, ApproverCheck
from engine.conversation.parts import Message, Part
from engine.engine import EngineOptions
from engine.model import ChunkSink, ModelRequest, ModelResponse
from engine.scripted import transaction_id
from engine.store import SessionStore
from examples.banking import TransferReceipt, TransferRequest, book
from stores import InMemorySessionStore, SqlSessionStore
from stores.settings import current_settings

__all__ = ["GuardedApp", "TransferFirstModel", "build"]

_TRANSFER = re.compile(r"transfer \$?(\d+) to (.+)", re.IGNORECASE | re.ASCII)


class TransferFirstModel:
    """The scripted model, but a user's "transfer $N to X" calls ``transferMoney`` at once."""

    def __init__(self) -> None:
        self._scripted = ScriptedModel()

    @property
    def name(self) -> str:
        """Always ``scripted-transfer``."""
        return "scripted-transfer"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """A ``transferMoney`` request for a transfer asked in the last message, else the
        scripted model's answer (which reports a finished transfer's transaction)."""
        last = request.messages[-1] if request.messages else None
        match = _TRANSFER.search(last.text) if last is not None and last.role == "user" else None
        if match is None:
            return await self._scripted.generate(request, on_chunk)
        account = match[2].strip().rstrip(".!?").strip()
        part = Part.of_request(
            "transferMoney", "transfer-1", {"amount": int(match[1]), "toAccount": account}
        )
        if on_chunk is not None:
            await on_chunk([part.copy_deep()])
        return ModelResponse(message=Message(role="model", content=[part]))


@dataclass
class GuardedApp:
    """One copy of the app: the engine, the guarded tool, the agent, the transfers made."""

    ai: Engine
    transfer_money: Tool
    agent: Agent
    #: Every transfer actually executed, with the idempotency key it ran under.
    transfers: list[tuple[str, TransferRequest]] = field(default_factory=list)


def build(
    *,
    store: SessionStore | None = None,
    editable: bool = True,
    approvers: ApprovalPolicy | ApproverCheck | None = None,
    required_approvals: int | None = None,
    ledger: Path | None = None,
    execution: str = "auto",
    options: EngineOptions | None = None,
) -> GuardedApp:
    """Define the engine (with ``options``, a deployment's settings), the guarded
    ``transferMoney`` tool and ``guardedAgent``."""
    ai = Engine(model=TransferFirstModel(), **(options or EngineOptions()))
    transfers: list[tuple[str, TransferRequest]] = []

    def transfer(request: TransferRequest, ctx: ToolContext) -> TransferReceipt:
        """Pause for an approver on the first execution; move the money once restarted."""
        if ctx.resumed is None:
            ctx.interrupt({"reason": f"Transfer ${request.amount:g} to {request.toAccount}?"})
        transfers.append((ctx.idempotency_key, request))
        if ledger is not None:
            book(ledger, ctx.idempotency_key, request)
        return TransferReceipt(
            success=True, transactionId=transaction_id(request.amount, request.toAccount)
        )

    transfer_money = ai.define_tool(
        name="transferMoney",
        description="Transfer money to a specified account (an approver confirms it first).",
        input_schema=TransferRequest,
        output_schema=TransferReceipt,
        fn=transfer,
        editable=editable,
        approvers=approvers,
        required_approvals=required_approvals,
    )
    agent = ai.define_agent(
        name="guardedAgent",
        system="You are a banking assistant. Transfers wait for an approver.",
        tools=[transfer_money],
        store=store if store is not None else InMemorySessionStore(),
        execution=execution,
    )
    return GuardedApp(ai=ai, transfer_money=transfer_money, agent=agent, transfers=transfers)


def _durable_app() -> GuardedApp:
    """The module-level app, configured by the process's settings, with ``TURNSTILE_LEDGER``."""
    settings = current_settings()
    ledger = os.environ.get("TURNSTILE_LEDGER")
    return build(
        store=SqlSessionStore(settings.database_url),
        ledger=Path(ledger) if ledger else None,
        options=settings.engine_options(),
    )


app = _durable_app()
ai = app.ai
