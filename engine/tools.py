"""Tools, interrupts and the context a tool runs with.

An interrupt is a tool used as control flow: its body never runs, it pauses the turn so a
human (or other code) can answer. A regular tool can pause itself too, conditionally, with
``ctx.interrupt(metadata)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import string
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from engine.conversation.parts import MALFORMED_INPUT, Part
from engine.conversation.schemas import Schema, SchemaSpec, SchemaViolation
from engine.conversation.session_state import Artifact, Effect, LiveState
from engine.errors import ToolError
from engine.escalation import escalation_chain
from engine.model import ToolSpec

if TYPE_CHECKING:
    from engine.approval_policy import ApprovalPolicy
    from engine.webhooks import Webhook

__all__ = [
    "InterruptTool",
    "SummarySpec",
    "Tool",
    "ToolContext",
    "ToolFn",
    "ToolInterrupt",
    "check_wording",
    "in_daemon_thread",
    "malformed_call_reason",
    "seconds_of",
]

ToolFn = Callable[..., Any] | Callable[..., Awaitable[Any]]

#: What ``summary=`` accepts: a template over the call's input (``"Transfer ${amount} to
#: {toAccount}"``), or a function of the validated input returning text (rendered by
#: :mod:`engine.approvals.wording`).
SummarySpec = str | Callable[[Any], str]


class ToolInterrupt(BaseException):
    """Raised by ``ctx.interrupt()`` to pause the turn at this tool call.

    A ``BaseException`` on purpose: a tool body's ``except Exception`` must not swallow it.
    """

    def __init__(self, metadata: Any = True) -> None:
        super().__init__("tool interrupted")
        self.metadata = metadata if metadata is not None else True


@dataclass(frozen=True)
class ToolContext:
    """What a running tool knows about its call.

    ``resumed`` is ``None`` on a first execution and the restart metadata (``True`` unless the
    caller gave a dict) when the call was restarted after an interrupt. ``idempotency_key``
    is the same on every execution of one tool request — after a crash and on a restart — so
    a tool can hand it to an external API to make its effect happen once.
    """

    name: str
    ref: str
    turn_id: str
    session_id: str
    idempotency_key: str
    resumed: Any = None
    #: The running turn's session state (``None`` outside a turn, e.g. a tool called alone).
    session: LiveState | None = None
    #: This call's changes to it, recorded on its journal row (see
    #: :mod:`engine.conversation.session_state`).
    effects: list[Effect] = field(default_factory=list)

    def interrupt(self, metadata: Any = None) -> NoReturn:
        """Pause the turn here; ``metadata`` is shown to whoever answers (``True`` if none)."""
        raise ToolInterrupt(metadata)

    @property
    def state(self) -> Any:
        """A copy of the session's custom state (``None`` when it has none)."""
        return self._session().custom

    @property
    def artifacts(self) -> list[Artifact]:
        """Copies of the session's artifacts."""
        return self._session().artifacts

    def update_state(self, change: Any) -> Any:
        """Replace the session's custom state with ``change``, or with ``change(current)``
        when it is callable (``current`` is a copy); returns the new state.

        A value that breaks the agent's ``state_schema`` raises
        :class:`~engine.conversation.session_state.StateSchemaError` (``INVALID_ARGUMENT``) and
        changes nothing; uncaught, it fails the call like any tool error."""
        return self._session().update_custom(change, self.effects)

    def add_artifact(self, artifact: Artifact | Mapping[str, Any]) -> None:
        """Add an artifact (``{name?, parts, metadata?}``), replacing the one of its name."""
        self._session().add_artifact(artifact, self.effects)

    def _session(self) -> LiveState:
        if self.session is None:
            raise ToolError(
                f"Tool '{self.name}' uses session state outside a turn.",
                status="FAILED_PRECONDITION",
            )
        return self.session


def check_wording(title: Any, summary: Any) -> None:
    """Refuse, at definition time, a ``title`` or ``summary`` of the wrong kind, or a summary
    template that is not a valid format string."""
    if title is not None and (not isinstance(title, str) or not title.strip()):
        raise ValueError("title must be a non-empty string.")
    if summary is None:
        return
    if isinstance(summary, str):
        if not summary.strip():
            raise ValueError("summary must be a non-empty template or a function.")
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(summary) if f is not None]
        except ValueError as problem:
            raise ValueError(f"summary is not a valid template: {problem}") from problem
        if any(not n or n[0].isdigit() for n in names):
            raise ValueError("summary's template names the input's keys: {amount}, not {} or {0}.")
        return
    if not callable(summary):
        raise ValueError("summary must be a template string or a function of the input.")


def _wants_context(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes a second positional parameter (the ToolContext)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in positional)


class Tool:
    """A function the model may call, with validated input and output."""

    is_interrupt = False

    def __init__(
        self,
        *,
        name: str,
        description: str = "",
        input_schema: SchemaSpec = None,
        output_schema: SchemaSpec = None,
        fn: ToolFn | None = None,
        idempotent: bool = True,
        editable: bool = False,
        approval_policy: ApprovalPolicy | None = None,
        webhooks: Sequence[Webhook] = (),
        title: str | None = None,
        summary: SummarySpec | None = None,
    ) -> None:
        if not name:
            raise ValueError("A tool needs a name.")
        check_wording(title, summary)
        #: What an approval of this tool is called, and what it asks, in the approver's
        #: words (see :mod:`engine.approvals.wording`); ``None``: the code name, the input.
        self.title = title
        self.summary = summary
        self.name = name
        self.description = description
        self.input = Schema(input_schema)
        self.output = Schema(output_schema)
        self.fn = fn
        #: A tool declared non-idempotent is not re-run blindly after a crash left its call
        #: started but unfinished (the durable runner asks a human instead).
        self.idempotent = idempotent
        #: An approver deciding a paused call of an editable tool may change its arguments
        #: before restarting it (see :mod:`engine.approvals.edits`); any other restart must keep
        #: them.
        self.editable = editable
        #: Who may decide a paused call of this tool in the inbox (``None``: no policy).
        self.approval_policy = approval_policy
        #: Who hears of this tool's approvals (:mod:`engine.approvals.webhooks`).
        self.webhooks: tuple[Webhook, ...] = tuple(webhooks)
        self._fn_takes_ctx = _wants_context(fn) if fn is not None else False
        self._spec: ToolSpec | None = None

    def spec(self) -> ToolSpec:
        """The description of this tool offered to the model (built once: JSON-schema
        generation is not free, and every model call needs it)."""
        if self._spec is None:
            self._spec = ToolSpec(
                name=self.name,
                description=self.description,
                input_schema=self.input.json_schema(),
                output_schema=self.output.json_schema(),
            )
        return self._spec

    def parse_input(self, raw: Any) -> Any:
        """Validate the model's input for this tool (raises :class:`ToolError`)."""
        try:
            return self.input.parse(raw)
        except SchemaViolation as exc:
            raise ToolError(
                f"Tool '{self.name}' was called with input that does not match its input "
                f"schema: {exc}",
                status="INVALID_ARGUMENT",
            ) from exc

    async def invoke(self, raw_input: Any, ctx: ToolContext) -> Any:
        """Run the tool: validate input, call ``fn``, validate output; return JSON data.

        Sync functions run in a thread of their own so they cannot stall the event loop (see
        :func:`in_daemon_thread`). Raises :class:`ToolInterrupt` when the tool pauses.
        """
        value = self.parse_input(raw_input)
        if self.fn is None:
            raise ToolInterrupt(True)
        args: tuple[Any, ...] = (value, ctx) if self._fn_takes_ctx else (value,)
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(*args)
        else:
            result = await in_daemon_thread(self.fn, *args, name=f"tool {self.name}")
            if inspect.isawaitable(result):
                result = await result
        try:
            return self.output.dump(result)
        except SchemaViolation as exc:
            raise ToolError(
                f"Tool '{self.name}' returned output that does not match its output schema: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class InterruptTool(Tool):
    """A tool whose only job is to pause the turn (``define_interrupt``).

    ``timeout`` (seconds or a timedelta) and ``on_timeout`` (a default answer, ``"fail"``, or
    ``{"escalate": ...}``, a group or a chain: :mod:`engine.escalation`) describe
    what happens to an approval nobody answers; the durable worker pool enforces them.
    ``group`` assigns every approval to a group from the start and ``remind_every`` (seconds
    or a timedelta) asks for reminders while it stays open (see
    :mod:`engine.approvals.assignment`).
    ``approval_policy`` (see :mod:`engine.approval_policy`) says who may decide it and how
    many approvals it needs; the inbox enforces it.
    """

    is_interrupt = True

    def __init__(
        self,
        *,
        name: str,
        description: str = "",
        input_schema: SchemaSpec = None,
        output_schema: SchemaSpec = None,
        metadata: Any = None,
        timeout: float | timedelta | None = None,
        on_timeout: Any = None,
        approval_policy: ApprovalPolicy | None = None,
        group: str | None = None,
        remind_every: float | timedelta | None = None,
        webhooks: Sequence[Webhook] = (),
        title: str | None = None,
        summary: SummarySpec | None = None,
    ) -> None:
        super().__init__(
            name=name,
            description=description,
            input_schema=input_schema,
            output_schema=output_schema,
            fn=None,
            approval_policy=approval_policy,
            webhooks=webhooks,
            title=title,
            summary=summary,
        )
        self.metadata = metadata
        self.timeout = seconds_of(timeout, "timeout")
        #: The groups an overdue approval moves to (``on_timeout={"escalate": ...}``).
        self.escalation = escalation_chain(
            name, on_timeout, timeout=self.timeout, policy=approval_policy
        )
        # An escalation is not an answer: expiry must never resume the turn with it.
        self.on_timeout = None if self.escalation is not None else on_timeout
        if group is not None and not group.strip():
            raise ValueError("group must name a group (a role), not be empty.")
        self.group = group
        self.remind_every = seconds_of(remind_every, "remind_every")

    @property
    def expires_after(self) -> float | None:
        """Seconds after which expiry decides an unanswered approval (``None``: never; an
        escalating interrupt is moved, not decided)."""
        return None if self.escalation is not None else self.timeout

    async def invoke(self, raw_input: Any, ctx: ToolContext) -> Any:
        """Validate the input, then pause: an interrupt never executes."""
        self.parse_input(raw_input)
        raise ToolInterrupt(self.metadata if self.metadata is not None else True)


async def in_daemon_thread(fn: Callable[..., Any], *args: Any, name: str) -> Any:
    """``fn(*args)`` in a new daemon thread (with the caller's context variables), awaited.

    Not the loop's default executor: a process waits for that executor's threads before it
    exits, so a synchronous tool still running at shutdown would hold the process past its
    grace period. Cancelling the await abandons the call: the thread runs on (Python cannot
    stop it), its result is dropped, and a process that exits ends it wherever it is.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(outcome: BaseException | None, result: Any) -> None:
        if done.done():  # abandoned: the awaiting task was cancelled
            return
        if outcome is None:
            done.set_result(result)
        else:
            done.set_exception(outcome)

    def run() -> None:
        try:
            result = context.run(fn, *args)
        except BaseException as exc:  # handed to the awaiting task, as to_thread does
            report: tuple[BaseException | None, Any] = (exc, None)
        else:
            report = (None, result)
        # The loop may be closed by now (the process is shutting down): nobody waits.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *report)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done


def seconds_of(value: float | timedelta | None, what: str) -> float | None:
    """``value`` as positive seconds (``None`` stays ``None``); ``ValueError`` otherwise."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not seconds > 0:
        raise ValueError(f"{what} must be positive (seconds or a timedelta), not {value!r}.")
    return seconds


def malformed_call_reason(tool: Tool, part: Part) -> str | None:
    """Why the model's call of ``tool`` is malformed (non-JSON arguments, input failing the
    schema), as a message addressed to the model; ``None`` for a well-formed call."""
    request = part.tool_request
    assert request is not None
    malformed = part.meta().get(MALFORMED_INPUT)
    if malformed is not None:
        return (
            f"Tool '{tool.name}' was called with arguments that are not valid JSON "
            f"({malformed}). Call it again with a JSON object matching its input schema."
        )
    try:
        tool.parse_input(request.input)
    except ToolError as exc:
        return f"{exc.message}. Call it again with input matching its input schema."
    return None
