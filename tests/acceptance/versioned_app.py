"""Two versions of one payments app, for the pinned-definition acceptance tests.

``tests.acceptance.versioned_v1:ai`` and ``tests.acceptance.versioned_v2:ai`` are what two
``turnstile worker`` processes serve during a rolling deploy: the same agent, ``payments``,
whose v2 renamed the approval interrupt (``approveTransfer`` → ``confirmTransfer``), added a
``currency`` to the transfer tool's input and rewrote the system prompt. Each version's model
signs its answers with its version, so a test sees which version ran a turn. The test process
builds its own copies with :func:`build` (v2 with or without the migration from v1).
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from engine import Engine, Part
from engine.conversation.parts import Message
from engine.model import ChunkSink, ModelRequest, ModelResponse
from engine.state.versioning import PausedTurn
from stores import SqlSessionStore

__all__ = ["AGENT", "INTERRUPT", "build"]

AGENT = "payments"
#: The approval interrupt's name in each version.
INTERRUPT = {"v1": "approveTransfer", "v2": "confirmTransfer"}
STATE_KEYS = {"versioned-test": "versioned-acceptance-test-key-0123456789"}


class Decision(BaseModel):
    approved: bool


class TransferV1(BaseModel):
    amount: int


class TransferV2(BaseModel):
    amount: int
    currency: str


class SignedModel:
    """Asks for approval on a user message; once answered, says which version ran it."""

    name = "scripted"

    def __init__(self, version: str) -> None:
        self.version = version

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """The next message of the two-step script."""
        last = request.messages[-1]
        if last.role == "user":
            message = Message(
                role="model",
                content=[Part.of_request(INTERRUPT[self.version], None, {"amount": 5})],
            )
        else:
            answered = [p.tool_response.name for p in last.content if p.tool_response]
            message = Message(
                role="model",
                content=[Part.of_text(f"done by {self.version} after {','.join(answered)}")],
            )
        return ModelResponse(message=message)


def rename_approval(state: PausedTurn) -> PausedTurn:
    """v1 → v2: the paused call and its answer take the interrupt's new name."""
    for part in state.messages[-1].content:
        if part.tool_request is not None and part.tool_request.name == INTERRUPT["v1"]:
            part.tool_request.name = INTERRUPT["v2"]
    for part in state.respond:
        if part.tool_response is not None and part.tool_response.name == INTERRUPT["v1"]:
            part.tool_response.name = INTERRUPT["v2"]
    return state


def build(version: str, *, url: str | None = None, migration: bool = False) -> Engine:
    """The app at ``version`` (``v1`` or ``v2``) on ``url`` (default: the CLI's database)."""
    store = SqlSessionStore(url or os.environ["TURNSTILE_DATABASE_URL"])
    ai = Engine(model=SignedModel(version), version=version, state_keys=STATE_KEYS)
    approval = ai.define_interrupt(name=INTERRUPT[version], output_schema=Decision)
    transfer = ai.define_tool(
        name="transfer",
        input_schema=TransferV1 if version == "v1" else TransferV2,
        fn=lambda _: {"ok": True},
    )
    system = "Move money when asked." if version == "v1" else "Move money; confirm first."
    ai.define_agent(name=AGENT, system=system, tools=[approval, transfer], store=store, max_turns=3)
    if migration:
        ai.migrate(from_version="v1")(rename_approval)
    return ai
