"""The app the durable acceptance tests' worker processes serve.

``turnstile worker --app tests.acceptance.durable_app:ai`` loads :data:`ai`, built from the
environment by :func:`make_app` (the CLI exports ``TURNSTILE_DATABASE_URL`` before the import);
the test process calls :func:`make_app` itself with the same settings, so both sides define the
same agents on the same database.

It is the seed's banking example (same interrupt, tool, schemas and system prompt) with what
the tests need to watch real processes from outside:

* every execution of ``transferMoney`` appends ``start <idempotency key> <pid>`` and
  ``done <idempotency key> <pid>`` lines to an execution log (``TEST_EXECUTIONS``), each with
  one ``O_APPEND`` write, so lines from concurrent processes never interleave and a line
  written before a SIGKILL is kept (it is in the kernel's page cache);
* a transfer takes ``TEST_TRANSFER_SECONDS`` and books into the idempotent JSON-lines ledger
  of :func:`examples.banking.book` (``TEST_LEDGER``);
* the model may take ``TEST_MODEL_AFTER_TOOL_SECONDS`` before answering a transferMoney
  result, so a test can kill a worker after a tool call finished but before the turn settled;
* ``tallyAgent`` keeps a custom session state: its first round runs ``tallyFast`` and
  ``tallySlow`` (which takes ``TEST_TRANSFER_SECONDS``) side by side, its second round
  ``tallySlow`` again; each call adds one to its own counter in the state and logs its
  execution, so a test can kill a worker mid round and count both executions and patches;
* ``expiringAgent`` and ``strictAgent`` pause at a ``userApproval`` interrupt that expires after
  ``TEST_APPROVAL_TIMEOUT`` seconds, answered ``{"approved": false, "feedback": "expired"}``
  or failing the turn, decided by the worker process's scheduler.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import Agent, Engine, InterruptTool, ScriptedModel, Tool, ToolContext
from engine.approvals.expiry import FAIL
from engine.conversation.parts import Message, Part
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

__all__ = ["DurableApp", "make_app"]

STATE_KEYS = {"durable-test": "durable-acceptance-test-key-0123456789"}
#: The default answer of an expired approval on ``expiringAgent``.
EXPIRED_ANSWER = {"approved": False, "feedback": "expired"}


def log_execution(path: Path | None, event: str, key: str) -> None:
    """Append ``<event> <key> <pid>`` to the execution log with a single O_APPEND write."""
    if path is None:
        return
    line = f"{event} {key} {os.getpid()}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class PacedModel:
    """The scripted model, optionally pausing before it answers a transferMoney result."""

    name = "scripted"

    def __init__(self, after_tool_seconds: float = 0.0) -> None:
        self.inner = ScriptedModel()
        self.after_tool_seconds = after_tool_seconds

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """Answer as the scripted model does, after the configured pause."""
        last = request.messages[-1] if request.messages else None
        if self.after_tool_seconds and last is not None and last.role == "tool":
            names = {p.tool_response.name for p in last.content if p.tool_response is not None}
            if "transferMoney" in names:
                await asyncio.sleep(self.after_tool_seconds)
        return await self.inner.generate(request, on_chunk)


class TallyModel:
    """``tallyAgent``'s model: both tallies, then the slow one again, then ``done``."""

    name = "tally"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """The next step, read from the conversation."""
        last = request.messages[-1]
        answered = {p.tool_response.ref for p in last.content if p.tool_response is not None}
        if last.role == "user":
            parts = [
                Part.of_request("tallyFast", "fast-1", {}),
                Part.of_request("tallySlow", "slow-1", {}),
            ]
        elif "slow-1" in answered:
            parts = [Part.of_request("tallySlow", "slow-2", {})]
        else:
            parts = [Part.of_text("done")]
        return ModelResponse(message=Message(role="model", content=parts))


@dataclass
class DurableApp:
    """The engine and its agents."""

    ai: Engine
    store: SqlSessionStore
    banking_agent: Agent
    expiring_agent: Agent
    strict_agent: Agent
    tally_agent: Agent
    transfer_money: Tool


def _approval(timeout: float | None = None, on_timeout: Any = None) -> InterruptTool:
    return InterruptTool(
        name="userApproval",
        description="Ask the user for approval before a sensitive action.",
        input_schema=ApprovalRequest,
        output_schema=ApprovalDecision,
        timeout=timeout,
        on_timeout=on_timeout,
    )


def make_app(
    url: str,
    *,
    lease_seconds: float = 2.0,
    ledger: Path | None = None,
    executions: Path | None = None,
    transfer_seconds: float = 0.0,
    model_after_tool_seconds: float = 0.0,
    approval_timeout: float = 1.0,
) -> DurableApp:
    """Build the engine with its three agents on one :class:`SqlSessionStore` at ``url``."""
    store = SqlSessionStore(url)
    ai = Engine(model=PacedModel(model_after_tool_seconds), state_keys=STATE_KEYS)
    lease = LeaseSettings(lease_seconds=lease_seconds, heartbeat_interval=lease_seconds / 4)

    def transfer(request: TransferRequest, ctx: ToolContext) -> TransferReceipt:
        """Move the money: log, take the configured time, book under the idempotency key."""
        log_execution(executions, "start", ctx.idempotency_key)
        if transfer_seconds:
            time.sleep(transfer_seconds)
        if ledger is not None:
            book(ledger, ctx.idempotency_key, request)
        log_execution(executions, "done", ctx.idempotency_key)
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

    def tally(counter: str) -> Any:
        async def count(_: Any, ctx: ToolContext) -> str:
            log_execution(executions, "start", ctx.idempotency_key)
            if counter == "slow" and transfer_seconds:
                await asyncio.sleep(transfer_seconds)
            ctx.update_state(lambda s: {**(s or {}), counter: (s or {}).get(counter, 0) + 1})
            ctx.add_artifact({"name": f"{counter}-log", "parts": [{"text": ctx.idempotency_key}]})
            log_execution(executions, "done", ctx.idempotency_key)
            return counter

        return count

    tally_agent = ai.define_agent(
        name="tallyAgent",
        model=TallyModel(),
        tools=[
            ai.define_tool(name="tallyFast", fn=tally("fast")),
            ai.define_tool(name="tallySlow", fn=tally("slow")),
        ],
        store=store,
        lease=lease,
    )

    def agent(name: str, approval: InterruptTool) -> Agent:
        return ai.define_agent(
            name=name,
            system=SYSTEM_PROMPT,
            tools=[approval, transfer_money],
            store=store,
            lease=lease,
        )

    # Interrupt names are unique per engine registry, so the expiring variants of
    # userApproval are Tool objects handed to their agent only (not registered).
    return DurableApp(
        ai=ai,
        store=store,
        banking_agent=agent("bankingAgent", user_approval),
        expiring_agent=agent("expiringAgent", _approval(approval_timeout, EXPIRED_ANSWER)),
        strict_agent=agent("strictAgent", _approval(approval_timeout, FAIL)),
        tally_agent=tally_agent,
        transfer_money=transfer_money,
    )


def _from_env() -> DurableApp:
    env = os.environ
    ledger = env.get("TEST_LEDGER")
    executions = env.get("TEST_EXECUTIONS")
    return make_app(
        env["TURNSTILE_DATABASE_URL"],
        lease_seconds=float(env.get("TEST_LEASE_SECONDS") or 2),
        ledger=Path(ledger) if ledger else None,
        executions=Path(executions) if executions else None,
        transfer_seconds=float(env.get("TEST_TRANSFER_SECONDS") or 0),
        model_after_tool_seconds=float(env.get("TEST_MODEL_AFTER_TOOL_SECONDS") or 0),
        approval_timeout=float(env.get("TEST_APPROVAL_TIMEOUT") or 1),
    )


_built: dict[str, DurableApp] = {}


def __getattr__(name: str) -> Any:
    # Built on first access (PEP 562), so importing this module in the test process does not
    # build an app on whatever TURNSTILE_DATABASE_URL happens to be.
    if name == "ai":
        if "app" not in _built:
            _built["app"] = _from_env()
        return _built["app"].ai
    raise AttributeError(name)
