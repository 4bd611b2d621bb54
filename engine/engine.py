"""The :class:`Engine`: a registry of the model, tools, interrupts and agents."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypedDict

from engine.agent import Agent, check_unclaimed_warning
from engine.approval_policy import ApprovalPolicy, ApproverCheck, policy_of
from engine.conversation.schemas import SchemaSpec
from engine.model import Model
from engine.state.signing import StateSigner
from engine.state.versioning import Migration, MigrationFn
from engine.store import SessionStore
from engine.store.signals import AbortSignal
from engine.tools import InterruptTool, SummarySpec, Tool, ToolFn
from engine.turns.executor import LeaseSettings, RetryPolicy
from engine.turns.handover import LocalSlots
from engine.webhooks import Webhook, WebhookRoutes

__all__ = ["Engine", "EngineOptions"]


class EngineOptions(TypedDict, total=False):
    """The options of :class:`Engine` a deployment configures, as keyword arguments:
    ``Engine(model=..., **options)``. ``stores.settings.Settings.engine_options()`` makes
    one from ``TURNSTILE_STATE_KEYS``, ``TURNSTILE_STATE_MAX_AGE``, ``TURNSTILE_APP_VERSION``
    and ``TURNSTILE_UNCLAIMED_WARNING``."""

    state_keys: Mapping[str, str | bytes] | None
    state_max_age: float | None
    version: str | None
    unclaimed_warning: float | None


class Engine:
    """Holds the default model and everything defined against it.

    ``state_keys`` (key id → secret) sign client-managed state; without them a random key
    per process is made (see :class:`StateSigner`). ``state_max_age``: seconds after which
    a signed state is refused (``None``: no limit).

    ``version`` is the application version every new turn is pinned to (workers claim only
    the versions they serve); without it each agent's tools version (the fingerprint of its
    tools and their schemas) stands in, and pinning is lenient (see
    :mod:`engine.state.versioning`). ``lenient_pinning=True`` makes it lenient under a
    declared version too (``turnstile worker/serve --dev`` sets it): a paused turn is
    resumed across a definition change that keeps every tool and schema (a prompt, a
    model, a description), with a warning naming the change (:mod:`engine.state.pinning`).
    ``unclaimed_warning``: the agents' seconds before a
    caller waiting for a queued turn that no worker claimed warns (default 30; 0 never).

    ``webhooks`` (group → :class:`~engine.webhooks.Webhook` list) tells those
    endpoints about every approval assigned to that group: opened, reminded, escalated to
    it, decided (the worker pool delivers them; docs/webhooks.md).
    The engine reads no environment variable: a deployment's ``TURNSTILE_*`` values reach it
    as these arguments, ``Engine(model=..., **current_settings().engine_options())``
    (``stores.settings``).
    """

    def __init__(
        self,
        *,
        model: Model,
        state_keys: Mapping[str, str | bytes] | None = None,
        state_max_age: float | None = None,
        version: str | None = None,
        unclaimed_warning: float | None = None,
        lenient_pinning: bool = False,
        webhooks: Mapping[str, Sequence[Webhook]] | None = None,
    ) -> None:
        if version is not None and not version.strip():
            raise ValueError("version must be a non-empty string (or None).")
        self.model = model
        #: The declared application version (``None``: each agent's fingerprint).
        self.version = version.strip() if version is not None else None
        self._lenient_pinning = lenient_pinning
        #: Seconds before a caller waiting for an unclaimed queued turn warns, for every agent.
        self.unclaimed_warning = check_unclaimed_warning(unclaimed_warning)
        #: Migrations registered with :meth:`migrate`, shared with every agent.
        self.migrations: list[Migration] = []
        self.signer = StateSigner(state_keys, max_age=state_max_age)
        self.tools: dict[str, Tool] = {}
        self.agents: dict[str, Agent] = {}
        #: Abort signals of the turns running in this process, by turn id.
        self.local_aborts: dict[str, AbortSignal] = {}
        #: The worker pools running in this process (each registers while it runs): a turn
        #: created while one has a free slot starts there, leased at creation.
        self.local_pools: list[LocalSlots] = []
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        #: Group webhooks, and every webhook by URL (:mod:`engine.approvals.webhooks`).
        self.webhooks = WebhookRoutes(webhooks)

    def migrate(
        self, *, from_version: str, agent: str | None = None
    ) -> Callable[[MigrationFn], MigrationFn]:
        """Register a migration: resuming a turn paused under ``from_version`` (an app
        version or a definition fingerprint) whose definition has since changed calls it
        with the :class:`~engine.state.versioning.PausedTurn` and continues with what it returns
        (the paused message and the answers, adjusted to the current definitions); the
        resumed turn is pinned to this engine's version. ``agent`` limits it to one agent.
        """
        if not from_version.strip():
            raise ValueError("from_version must be a non-empty string.")

        def register(fn: MigrationFn) -> MigrationFn:
            for known in self.migrations:
                if known.from_version == from_version and known.agent == agent:
                    raise ValueError(f"A migration from version '{from_version}' is registered.")
            self.migrations.append(Migration(from_version=from_version, fn=fn, agent=agent))
            return fn

        return register

    @property
    def lenient_pinning(self) -> bool:
        """Whether a resume may cross a definition change that keeps every tool and schema
        even under a declared version (without one it always may)."""
        return self._lenient_pinning

    @lenient_pinning.setter
    def lenient_pinning(self, lenient: bool) -> None:
        # Set after the app is loaded (``--dev``): its agents already exist.
        self._lenient_pinning = lenient
        for agent in self.agents.values():
            agent.lenient_pinning = lenient

    def versions(self) -> list[str]:
        """The application versions this engine's agents pin their turns to: the declared
        version, or each agent's tools version."""
        return sorted({agent.version for agent in self.agents.values()})

    def _register(self, tool: Tool) -> Tool:
        if tool.name in self.tools:
            raise ValueError(f"A tool named '{tool.name}' is already defined.")
        self.webhooks.add(tool.webhooks)
        self.tools[tool.name] = tool
        return tool

    def define_tool(
        self,
        *,
        name: str,
        description: str = "",
        input_schema: SchemaSpec = None,
        output_schema: SchemaSpec = None,
        fn: ToolFn,
        idempotent: bool = True,
        editable: bool = False,
        approvers: ApprovalPolicy | ApproverCheck | None = None,
        required_approvals: int | None = None,
        webhooks: Sequence[Webhook] = (),
        title: str | None = None,
        summary: SummarySpec | None = None,
    ) -> Tool:
        """Define a tool. ``fn(input, ctx)`` is sync or async; ``ctx`` may be left out.

        ``input`` is an instance of ``input_schema``; the return value (a dict or an instance
        of ``output_schema``) is validated against ``output_schema``. ``idempotent=False``
        tells the durable runner not to re-run a call a crash interrupted without asking.
        ``editable=True`` lets an approver deciding a paused call of this tool (one that
        paused itself with ``ctx.interrupt()``) change its arguments before restarting it;
        ``approvers`` and ``required_approvals`` set who may decide such a call, as for
        :meth:`define_interrupt`; ``webhooks`` hear of such a call's approval, and ``title``
        and ``summary`` say how the inbox words it, as for :meth:`define_interrupt`.
        """
        tool = Tool(
            name=name,
            description=description,
            input_schema=input_schema,
            output_schema=output_schema,
            fn=fn,
            idempotent=idempotent,
            editable=editable,
            approval_policy=policy_of(approvers, required_approvals),
            webhooks=webhooks,
            title=title,
            summary=summary,
        )
        return self._register(tool)

    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        input_schema: SchemaSpec = None,
        output_schema: SchemaSpec = None,
        idempotent: bool = True,
    ) -> Callable[[ToolFn], Tool]:
        """Decorator form of :meth:`define_tool` (name and description default to the
        function's name and docstring)."""

        def decorate(fn: ToolFn) -> Tool:
            return self.define_tool(
                name=name or str(getattr(fn, "__name__", "tool")),
                description=description if description is not None else (fn.__doc__ or "").strip(),
                input_schema=input_schema,
                output_schema=output_schema,
                fn=fn,
                idempotent=idempotent,
            )

        return decorate

    def define_interrupt(
        self,
        *,
        name: str,
        description: str = "",
        input_schema: SchemaSpec = None,
        output_schema: SchemaSpec = None,
        metadata: Any = None,
        timeout: float | timedelta | None = None,
        on_timeout: Any = None,
        approvers: ApprovalPolicy | ApproverCheck | None = None,
        required_approvals: int | None = None,
        group: str | None = None,
        remind_every: float | timedelta | None = None,
        webhooks: Sequence[Webhook] = (),
        title: str | None = None,
        summary: SummarySpec | None = None,
    ) -> InterruptTool:
        """Define an interrupt: a tool that pauses the turn until someone answers it.

        ``input_schema`` is what the model passes (shown to the human); ``output_schema`` is
        what the answer must satisfy (checked when resuming). ``approvers`` (a predicate over
        the deciding principal, or an :class:`~engine.approval_policy.ApprovalPolicy`) and
        ``required_approvals`` set the inbox's approval policy (maker-checker, quorum).
        ``timeout`` with ``on_timeout`` (a default answer, ``"fail"``, or
        ``{"escalate": "group"}``, or a chain of groups each with its own wait:
        ``{"escalate": [EscalationStep("leads", timedelta(hours=4)), ...]}``), ``group`` and
        ``remind_every`` set what happens to an approval nobody answers
        (:mod:`engine.approvals.expiry`, :mod:`engine.escalation`,
        :mod:`engine.approvals.assignment`). ``webhooks`` (:class:`~engine.webhooks.Webhook`)
        are told when an approval of it opens, is reminded about, escalates or is decided
        (docs/webhooks.md). ``title`` names the approval and ``summary`` says what it asks in
        the approver's words — a template over the input (``"Transfer ${amount} to
        {toAccount}"``) or a function of the validated input — on every page, listing and
        export that shows it (:mod:`engine.approvals.wording`).
        """
        tool = InterruptTool(
            name=name,
            description=description,
            input_schema=input_schema,
            output_schema=output_schema,
            metadata=metadata,
            timeout=timeout,
            on_timeout=on_timeout,
            approval_policy=policy_of(approvers, required_approvals),
            group=group,
            remind_every=remind_every,
            webhooks=webhooks,
            title=title,
            summary=summary,
        )
        self._register(tool)
        return tool

    def define_agent(
        self,
        *,
        name: str,
        system: str | None = None,
        tools: Sequence[Tool] = (),
        store: SessionStore | None = None,
        model: Model | None = None,
        max_turns: int = 5,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        lease: LeaseSettings | None = None,
        execution: str = "auto",
        state_schema: SchemaSpec = None,
        config: Mapping[str, Any] | None = None,
    ) -> Agent:
        """Define an agent. ``store=None`` means client-managed (signed) state.

        ``max_turns`` bounds the tool rounds of one send/resume; ``max_attempts`` bounds how
        often a turn is attempted after transient failures (default 3, with ``retry``'s
        backoff); an agent given neither has the default ``RetryPolicy()``, which
        ``turnstile worker --max-attempts`` / ``--retry-backoff`` may replace.
        ``execution``: ``auto`` queues turns for the worker pool when ``store`` is durable
        (a SQL store) and runs them in the caller otherwise; ``inline``/``workers`` force it.
        ``state_schema`` (a pydantic model or JSON schema) is what the session's custom state
        must match: tools' updates breaking it raise ``StateSchemaError``. ``config`` is the
        generation config every model call carries (Genkit's names, e.g. ``temperature``);
        it is not part of the pinned definition, so changing it never blocks a resume.
        """
        if name in self.agents:
            raise ValueError(f"An agent named '{name}' is already defined.")
        policy = retry
        if policy is None and max_attempts is not None:
            policy = RetryPolicy(max_attempts=max_attempts)
        agent = Agent(
            name=name,
            model=model or self.model,
            system=system,
            tools=tools,
            store=store,
            signer=self.signer,
            max_turns=max_turns,
            retry=policy,
            lease=lease,
            owner=self.owner,
            local_aborts=self.local_aborts,
            local_pools=self.local_pools,
            execution=execution,
            unclaimed_warning=self.unclaimed_warning,
            state_schema=state_schema,
            declared_version=self.version,
            lenient_pinning=self.lenient_pinning,
            migrations=self.migrations,
            config=config,
            webhooks=self.webhooks,
        )
        self.agents[name] = agent
        return agent
