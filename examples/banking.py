"""The seed's banking example: an approval-gated money transfer.

Defines ``ai`` (the :class:`~engine.Engine`), the ``userApproval`` interrupt, the
``transferMoney`` tool, ``banking_agent`` (with a session store) and
``banking_agent_stateless`` (client-managed state), exactly as ``docs/scripted-model.md``
describes, running on the offline :class:`~engine.ScriptedModel`.
"""

from __future__ import annotations

from pydantic import BaseModel

from engine import Engine, ScriptedModel, ToolContext
from engine.scripted import transaction_id
from stores import InMemorySessionStore

SYSTEM_PROMPT = (
    "You are a banking assistant. ALWAYS use the userApproval interrupt to "
    "confirm before executing transferMoney."
)


class ApprovalRequest(BaseModel):
    """What the model shows the human when it asks for approval."""

    action: str
    details: str


class ApprovalDecision(BaseModel):
    """The human's answer."""

    approved: bool
    feedback: str | None = None


class TransferRequest(BaseModel):
    """A transfer to make."""

    amount: float
    toAccount: str


class TransferReceipt(BaseModel):
    """The result of a transfer."""

    success: bool
    transactionId: str


#: Every transfer actually executed in this process (the demo and tests read it).
executed_transfers: list[tuple[str, TransferRequest]] = []

ai = Engine(model=ScriptedModel())

user_approval = ai.define_interrupt(
    name="userApproval",
    description="Ask the user for approval before a sensitive action.",
    input_schema=ApprovalRequest,
    output_schema=ApprovalDecision,
)


def transfer(request: TransferRequest, ctx: ToolContext) -> TransferReceipt:
    """Move the money (here: record it) and return the receipt."""
    executed_transfers.append((ctx.idempotency_key, request))
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

banking_agent = ai.define_agent(
    name="bankingAgent",
    system=SYSTEM_PROMPT,
    tools=[user_approval, transfer_money],
    store=InMemorySessionStore(),
)

banking_agent_stateless = ai.define_agent(
    name="bankingAgentStateless",
    system=SYSTEM_PROMPT,
    tools=[user_approval, transfer_money],
    store=None,
)
