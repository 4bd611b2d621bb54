"""A refund desk agent of your own, developed offline: a manager approves each refund."""

import asyncio
import re

from pydantic import BaseModel

from engine import Engine, FunctionModel, ModelRequest, ModelResponse
from stores import InMemorySessionStore


class RefundRequest(BaseModel):  # what the model asks the manager
    orderId: str


class RefundDecision(BaseModel):  # what the manager answers
    approved: bool
    note: str = ""


def order_in(text: str) -> str | None:
    """The order number the user mentions ("refund order 42"), if any."""
    match = re.search(r"order #?(\d+)", text, re.IGNORECASE)
    return match[1] if match else None


def refund_desk(request: ModelRequest) -> ModelResponse:
    """Stands in for the LLM while the agent is written: one decision per model call."""
    order = order_in(request.last_user_text)
    if order is None:
        return ModelResponse.of_text("Which order should I refund?")
    if refund := request.tool_response(issue_refund):  # the refund went through
        return ModelResponse.of_text(f"Refunded order {order} ({refund.output['refundId']}).")
    if decision := request.tool_response(manager_approval):  # the manager has answered
        if decision.output["approved"]:
            return ModelResponse.of_call(issue_refund, RefundRequest(orderId=order))
        return ModelResponse.of_text(f"Refund declined: {decision.output['note'] or 'no reason'}.")
    return ModelResponse.of_call(manager_approval, RefundRequest(orderId=order))  # pauses here


ai = Engine(model=FunctionModel(refund_desk))  # later: Engine(model=OpenAIChatModel(...))
refunds: list[str] = []  # what the (pretend) payment system refunded

manager_approval = ai.define_interrupt(
    name="managerApproval",
    description="Ask a manager to approve a refund.",
    input_schema=RefundRequest,
    output_schema=RefundDecision,
)


@ai.tool(name="issueRefund", input_schema=RefundRequest)
def issue_refund(refund: RefundRequest) -> dict[str, str]:
    """Refund an order in full."""
    refunds.append(refund.orderId)
    return {"refundId": f"rf-{refund.orderId}"}


refund_agent = ai.define_agent(
    name="refundAgent",
    system="You handle refunds. ALWAYS ask managerApproval before issueRefund.",
    tools=[manager_approval, issue_refund],
    store=InMemorySessionStore(),
)


async def main() -> None:
    """Ask for a refund, approve it as the manager, and print the outcome."""
    chat = refund_agent.chat()
    res = await chat.send("Please refund order 42.")
    [approval] = res.interrupts  # the turn paused at managerApproval
    print(approval.input)  # orderId='42'
    res = await chat.resume(respond=[approval.respond({"approved": True})])
    print(res.text)  # Refunded order 42 (rf-42).


if __name__ == "__main__":
    asyncio.run(main())
