"""The seed's banking example: an approval-gated money transfer.

Defines ``ai`` (the :class:`~engine.Engine`), the ``userApproval`` interrupt, the
``transferMoney`` tool, ``banking_agent`` (with a session store: the module-level app uses the
durable SQL store, tests build their own with :func:`build`) and
``banking_agent_stateless`` (client-managed state), exactly as ``docs/scripted-model.md``
describes, running on the offline :class:`~engine.ScriptedModel` — unless ``TURNSTILE_MODEL``
names a real one (``openai:gpt-4o-mini``, ``anthropic:claude-sonnet-4-5``, ``ollama:llama3.1``;
see ``docs/models.md``): then the module-level app talks to that model, while ``make demo``,
with the variable unset, stays offline.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from engine import Agent, Engine, InterruptTool, Model, ScriptedModel, Tool, ToolContext
from engine.engine import EngineOptions
from engine.scripted import transaction_id
from engine.store import SessionStore
from engine.turns.executor import LeaseSettings
from stores import InMemorySessionStore, SqlSessionStore
from stores.settings import current_settings

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


@dataclass
class BankingApp:
    """One independent copy of the banking example (tests build their own)."""

    ai: Engine
    user_approval: InterruptTool
    transfer_money: Tool
    banking_agent: Agent
    banking_agent_stateless: Agent
    #: Every transfer actually executed, with the idempotency key it ran under.
    transfers: list[tuple[str, TransferRequest]] = field(default_factory=list)


def build(
    *,
    store: SessionStore | None = None,
    model: Model | None = None,
    state_keys: Mapping[str, str | bytes] | None = None,
    options: EngineOptions | None = None,
    max_attempts: int = 3,
    execution: str = "auto",
    lease: LeaseSettings | None = None,
    ledger: Path | None = None,
    transfer_seconds: float = 0.0,
) -> BankingApp:
    """Define the engine, the interrupt, the tool and both agents.

    ``store`` defaults to a fresh :class:`~stores.InMemorySessionStore`; ``model`` to the
    :class:`~engine.ScriptedModel`. ``options`` are the engine's other options (a deployment's
    settings, ``Settings.engine_options()``); ``state_keys`` wins over theirs. With ``ledger``,
    each transfer is booked in that JSON-lines file under its idempotency key — once, however
    often the call is executed (a worker killed mid-transfer re-runs it with the same key).
    ``transfer_seconds`` makes a transfer take that long (the demo kills a worker in the
    middle of one).
    """
    engine_options = options.copy() if options is not None else EngineOptions()
    if state_keys is not None:
        engine_options["state_keys"] = state_keys
    ai = Engine(model=model or ScriptedModel(), **engine_options)
    transfers: list[tuple[str, TransferRequest]] = []

    user_approval = ai.define_interrupt(
        name="userApproval",
        description="Ask the user for approval before a sensitive action.",
        input_schema=ApprovalRequest,
        output_schema=ApprovalDecision,
        # What the inbox, the CLI and the history lead with, instead of the code name.
        title="Transfer approval",
        summary="{details}",
    )

    def transfer(request: TransferRequest, ctx: ToolContext) -> TransferReceipt:
        """Move the money (here: record it) and return the receipt."""
        transfers.append((ctx.idempotency_key, request))
        if ledger is not None:
            book(ledger, ctx.idempotency_key, request)
        if transfer_seconds:
            # The bank takes its time to confirm: a worker may die after the money moved and
            # before the journal knows; the re-run books nothing thanks to the key.
            time.sleep(transfer_seconds)
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
        store=store if store is not None else InMemorySessionStore(),
        max_attempts=max_attempts,
        execution=execution,
        lease=lease,
    )
    banking_agent_stateless = ai.define_agent(
        name="bankingAgentStateless",
        system=SYSTEM_PROMPT,
        tools=[user_approval, transfer_money],
        store=None,
        max_attempts=max_attempts,
    )
    return BankingApp(
        ai=ai,
        user_approval=user_approval,
        transfer_money=transfer_money,
        banking_agent=banking_agent,
        banking_agent_stateless=banking_agent_stateless,
        transfers=transfers,
    )


def book(ledger: Path, key: str, request: TransferRequest) -> bool:
    """Append a transfer to the ledger unless ``key`` is booked already; True if booked now.

    This is what a payment API does with an idempotency key: the effect happens once. Worker
    processes book into one file at once, so the key check and the append are one step under
    an exclusive lock: without it, two bookings of one key could both append, and a reader
    could see another's line half written.
    """
    ledger.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"key": key, "amount": request.amount, "toAccount": request.toAccount})
    with ledger.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        handle.seek(0)
        if key in {entry["key"] for entry in _entries(handle.read())}:
            return False
        handle.write(line + "\n")
    return True


def read_ledger(ledger: Path) -> list[dict[str, Any]]:
    """The ledger's entries (empty if there is no ledger yet)."""
    if not ledger.exists():
        return []
    with ledger.open() as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)  # no booking is half written while we read
        return _entries(handle.read())


def _entries(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _example_keys() -> Mapping[str, str | bytes]:
    """The key the example signs with when ``TURNSTILE_STATE_KEYS`` is unset: fit only for
    the example.

    The fixed key is public (it is right here), so anyone could sign a paused state with a
    forged approval: ``turnstile serve`` and ``turnstile worker`` refuse it unless ``--dev``
    is given (:func:`engine.state.signing.check_deployable_keys` knows its fingerprint). It stays
    so that ``--dev`` processes of the example verify each other's state.
    """
    return {"example-only": "turnstile-example-key-not-a-secret"}


def _durable_app() -> BankingApp:
    """The module-level app: durable, configured by the process's settings
    (:func:`stores.settings.current_settings`), so ``turnstile worker --app
    examples.banking:ai`` serves it on ``--db`` (or ``TURNSTILE_DATABASE_URL``; default: an
    SQLite file under ``.turnstile/``).

    ``TURNSTILE_MODEL`` picks a real model (the scripted one when unset);
    ``TURNSTILE_STATE_KEYS``, ``TURNSTILE_APP_VERSION`` and the engine's other settings are
    passed on as they are; ``TURNSTILE_LEDGER``, ``TURNSTILE_TRANSFER_SECONDS`` and
    ``TURNSTILE_LEASE_SECONDS``, the example's own variables, tune it for the demo.
    """
    settings = current_settings()
    options = settings.engine_options()
    if not options.get("state_keys"):
        options["state_keys"] = _example_keys()
    lease_seconds = float(os.environ.get("TURNSTILE_LEASE_SECONDS") or 30)
    ledger = os.environ.get("TURNSTILE_LEDGER")
    return build(
        store=SqlSessionStore(settings.database_url),
        model=settings.build_model(),
        options=options,
        lease=LeaseSettings(lease_seconds=lease_seconds, heartbeat_interval=lease_seconds / 3),
        ledger=Path(ledger) if ledger else None,
        transfer_seconds=float(os.environ.get("TURNSTILE_TRANSFER_SECONDS") or 0),
    )


app = _durable_app()
ai = app.ai
user_approval = app.user_approval
transfer_money = app.transfer_money
banking_agent = app.banking_agent
banking_agent_stateless = app.banking_agent_stateless
