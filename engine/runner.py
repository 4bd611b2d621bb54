"""The round loop of one turn, driven by the store's journal.

The runner rebuilds its position from what the store holds — committed rounds, the open
round's model message, the tool-call journal — so the same code runs a fresh turn and
continues one whose worker died: finished rounds and finished calls are never repeated, a
call that had started but not finished runs again with the same idempotency key (or, for a
tool declared non-idempotent, pauses the turn to ask a human whether the effect happened).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from engine.errors import AgentError, NotFoundError, StoreError, ToolError, TransientError
from engine.model import Model, ModelRequest, ModelUsage
from engine.parts import (
    INTERRUPT,
    MALFORMED_INPUT,
    PENDING_OUTPUT,
    RESOLVED_INTERRUPT,
    RESUMED,
    SOURCE,
    TOOL_ERROR,
    Message,
    Part,
)
from engine.response import AgentChunk
from engine.resume import paused_calls, plan_resume, strip_pending
from engine.status import FinishReason, TurnStatus
from engine.store import (
    RoundRecord,
    SessionStore,
    ToolCallRecord,
    ToolCallStatus,
    TurnError,
    TurnRecord,
)
from engine.tools import Tool, ToolContext, ToolInterrupt

__all__ = ["ChunkCallback", "RunnerConfig", "TurnOutcome", "TurnRunner", "error_of"]

logger = logging.getLogger("turnstile.runner")

ChunkCallback = Callable[[AgentChunk], Awaitable[None]]


@dataclass(frozen=True)
class RunnerConfig:
    """What the runner needs to know about the agent."""

    agent: str
    model: Model
    system: str | None
    tools: Mapping[str, Tool]
    max_turns: int = 5


@dataclass(frozen=True)
class TurnOutcome:
    """How the turn's work ended (the executor turns it into a status transition)."""

    status: TurnStatus
    finish_reason: FinishReason
    error: TurnError | None = None
    transient: bool = False


def _now() -> datetime:
    return datetime.now(UTC)


def error_of(exc: BaseException) -> TurnError:
    """The ``{status, message}`` recorded for an exception (never the raw exception)."""
    if isinstance(exc, AgentError):
        return TurnError(status=exc.status, message=exc.message, details=exc.details)
    status = "UNAVAILABLE" if isinstance(exc, TransientError) else "INTERNAL"
    return TurnError(status=status, message=str(exc) or type(exc).__name__)


def _rejection(tool: Tool, part: Part) -> str | None:
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


@dataclass
class _Result:
    """One call's result within a round: an output, or a pause with metadata."""

    output: Any = None
    interrupt: Any = None
    response_meta: dict[str, Any] | None = None

    @property
    def paused(self) -> bool:
        return self.interrupt is not None


class _Emitter:
    def __init__(self, sink: ChunkCallback | None) -> None:
        self._sink = sink
        self._role: str | None = None
        self._index = -1

    async def emit(self, role: str, content: list[Part]) -> None:
        if self._sink is None:
            return
        if role != self._role:
            self._role = role
            self._index += 1
        await self._sink(AgentChunk(role=role, index=self._index, content=content))


class TurnRunner:
    """Runs one claimed turn to an outcome; every write is fenced by ``lease_token``."""

    def __init__(
        self,
        config: RunnerConfig,
        store: SessionStore,
        turn: TurnRecord,
        on_chunk: ChunkCallback | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.turn = turn
        self.lease = turn.lease_token
        self._emitter = _Emitter(on_chunk)
        self._used_refs: set[str] = set()

    async def run(self) -> TurnOutcome:
        """Run (or continue) the turn; returns its outcome, raises only on cancellation."""
        try:
            return await self._run()
        except StoreError:
            # Not the turn's fault (lost lease, database down): the executor decides; the turn
            # stays pending and is recovered from its journal by whoever holds it next.
            raise
        except (ToolError, NotFoundError, AgentError) as exc:
            return TurnOutcome(TurnStatus.FAILED, FinishReason.FAILED, error_of(exc))
        except TransientError as exc:
            return TurnOutcome(
                TurnStatus.FAILED, FinishReason.FAILED, error_of(exc), transient=True
            )
        except Exception as exc:  # a tool or model bug must fail the turn, not the worker
            logger.exception("turn %s failed", self.turn.id)
            return TurnOutcome(TurnStatus.FAILED, FinishReason.FAILED, error_of(exc))

    async def _run(self) -> TurnOutcome:
        turn = self.turn
        parent_conversation: list[Message] = []
        if turn.parent_id is not None:
            parent_conversation = await self.store.load_conversation(turn.parent_id)
        history = parent_conversation[: turn.history_length]
        rounds = {r.round: r for r in await self.store.load_rounds(turn.id)}
        calls = {(c.round, c.ref): c for c in await self.store.list_calls(turn.id)}
        for message in parent_conversation:
            self._note_refs(message)
        for saved in rounds.values():
            for message in saved.messages:
                self._note_refs(message)

        if turn.input.kind == "expire":
            raise AgentError(turn.input.reason or "Approval expired.", status="DEADLINE_EXCEEDED")
        if turn.input.kind == "resume":
            done = rounds.get(0)
            if done is None or not done.committed:
                paused = parent_conversation[turn.history_length]
                outcome = await self._resume_round(paused, calls)
                if outcome is not None:
                    return outcome
                rounds = {r.round: r for r in await self.store.load_rounds(turn.id)}
            elif paused_calls(done.messages[-1]):
                return TurnOutcome(TurnStatus.COMPLETED, FinishReason.INTERRUPTED)
        if 0 in rounds and rounds[0].committed:
            history.extend(rounds[0].messages)

        number = 1
        while True:
            record: RoundRecord | None = rounds.get(number)
            if record is not None and record.committed:
                history.extend(record.messages)
                last = record.messages[-1]
                if last.role == "model":
                    if paused_calls(last):
                        return TurnOutcome(TurnStatus.COMPLETED, FinishReason.INTERRUPTED)
                    return TurnOutcome(TurnStatus.COMPLETED, FinishReason.STOP)
                number += 1
                continue
            if record is not None:
                # Recovery: the model already answered this round; never ask it again.
                model_message = record.messages[0]
                finish = FinishReason.STOP
                usage = None
            else:
                model_message, finish, usage = await self._call_model(history)
            requests = model_message.tool_requests
            if not requests:
                await self._save(number, [model_message], committed=True, usage=usage)
                return TurnOutcome(TurnStatus.COMPLETED, finish)
            if number > self.config.max_turns:
                raise AgentError(
                    f"Exceeded maximum tool call iterations ({self.config.max_turns})",
                    status="ABORTED",
                )
            if record is None:
                await self._save(
                    number,
                    [model_message],
                    committed=False,
                    calls=[self._requested(number, p) for p in requests],
                    usage=usage,
                )
            results = await self._run_calls(number, requests, calls, restarts={})
            closed = await self._close_round(number, model_message, results)
            if closed is None:
                return TurnOutcome(TurnStatus.COMPLETED, FinishReason.INTERRUPTED)
            history.extend(closed)
            number += 1

    # -- model ------------------------------------------------------------------------

    async def _call_model(
        self, history: list[Message]
    ) -> tuple[Message, FinishReason, ModelUsage | None]:
        messages = list(history)
        if self.config.system:
            messages.insert(0, Message(role="system", content=[Part.of_text(self.config.system)]))
        request = ModelRequest(
            messages=messages, tools=[t.spec() for t in self.config.tools.values()]
        )

        async def forward(parts: list[Part]) -> None:
            await self._emitter.emit("model", parts)

        response = await self.config.model.generate(request, forward)
        message = response.message.model_copy(deep=True)
        message.role = "model"
        for part in message.content:
            if part.tool_request is not None:
                part.tool_request.ref = self._unique_ref(
                    part.tool_request.name, part.tool_request.ref
                )
        try:
            finish = FinishReason(response.finish_reason)
        except ValueError:
            finish = FinishReason.OTHER
        return message, finish, response.usage

    def _note_refs(self, message: Message) -> None:
        for part in message.content:
            if part.tool_request is not None and part.tool_request.ref is not None:
                self._used_refs.add(part.tool_request.ref)

    def _unique_ref(self, name: str, ref: str | None) -> str:
        """The model's ref if unused in this session, else a fresh one (``ref~2``, ...)."""
        base = ref if ref else name
        candidate, n = base, 1
        while candidate in self._used_refs or (not ref and n == 1):
            n += 1
            candidate = f"{base}~{n}" if ref else f"{base}-{n - 1}"
            if not ref and candidate not in self._used_refs:
                break
        self._used_refs.add(candidate)
        return candidate

    # -- tools ------------------------------------------------------------------------

    def _key(self, ref: str) -> str:
        # Refs are unique within the session, so the turn and the ref name the request.
        return f"{self.turn.id}:{ref}"

    def _requested(self, number: int, part: Part) -> ToolCallRecord:
        request = part.tool_request
        assert request is not None and request.ref is not None
        return ToolCallRecord(
            turn_id=self.turn.id,
            round=number,
            ref=request.ref,
            name=request.name,
            input=request.input,
            status=ToolCallStatus.REQUESTED,
            idempotency_key=self._key(request.ref),
        )

    def _tool(self, name: str) -> Tool:
        tool = self.config.tools.get(name)
        if tool is None:
            raise NotFoundError(f"Tool '{name}' not found")
        return tool

    async def _run_calls(
        self,
        number: int,
        requests: list[Part],
        calls: Mapping[tuple[int, str], ToolCallRecord],
        restarts: Mapping[str, Any],
    ) -> dict[str, _Result]:
        """Run the round's calls concurrently, reusing whatever the journal already holds."""
        results: dict[str, _Result] = {}
        pending: list[tuple[Part, ToolCallRecord]] = []
        for part in requests:
            request = part.tool_request
            assert request is not None and request.ref is not None
            tool = self._tool(request.name)
            row = calls.get((number, request.ref)) or self._requested(number, part)
            rejection = _rejection(tool, part)
            if rejection is not None:
                # A malformed call goes back to the model as a tool error it can correct
                # (bounded by max_turns); re-validating on recovery gives the same answer.
                results[request.ref] = _Result(
                    output={"error": rejection}, response_meta={TOOL_ERROR: True}
                )
                if row.status is not ToolCallStatus.FAILED:
                    failed = TurnError(status="INVALID_ARGUMENT", message=rejection)
                    await self._record(
                        row, status=ToolCallStatus.FAILED, error=failed, finished_at=_now()
                    )
                continue
            if row.status is ToolCallStatus.DONE:
                results[request.ref] = _Result(output=row.output)
            elif row.status is ToolCallStatus.INTERRUPTED:
                results[request.ref] = _Result(interrupt=row.interrupt)
            elif row.status is ToolCallStatus.FAILED and row.error is not None:
                raise ToolError(row.error.message, status=row.error.status)
            elif row.status is ToolCallStatus.RUNNING and not tool.idempotent:
                meta = {
                    "unfinished": True,
                    "message": (
                        f"Tool '{tool.name}' started but did not finish before its worker "
                        "stopped, and it is not idempotent. Respond with its output if the "
                        "effect happened, or restart it to run it again."
                    ),
                }
                await self._record(row, status=ToolCallStatus.INTERRUPTED, interrupt=meta)
                results[request.ref] = _Result(interrupt=meta)
            else:
                pending.append((part, row))
        outcomes = await asyncio.gather(
            *(self._execute(row, restarts.get(row.ref)) for _, row in pending),
            return_exceptions=True,
        )
        failure: BaseException | None = None
        for (_, row), outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            if isinstance(outcome, BaseException):
                failure = failure or outcome
            else:
                results[row.ref] = outcome
        if failure is not None:
            raise failure
        return results

    async def _record(self, row: ToolCallRecord, **changes: Any) -> ToolCallRecord:
        updated = row.model_copy(update=changes)
        await self.store.record_call(self.turn.id, lease_token=self.lease, call=updated)
        return updated

    async def _execute(self, row: ToolCallRecord, resumed: Any) -> _Result:
        tool = self._tool(row.name)
        row = await self._record(
            row, status=ToolCallStatus.RUNNING, started_at=_now(), resumed=resumed
        )
        ctx = ToolContext(
            name=row.name,
            ref=row.ref,
            turn_id=self.turn.id,
            session_id=self.turn.session_id,
            idempotency_key=row.idempotency_key,
            resumed=resumed,
        )
        try:
            output = await tool.invoke(row.input, ctx)
        except ToolInterrupt as pause:
            finished = _now()
            timeout = getattr(tool, "timeout", None)
            await self._record(
                row,
                status=ToolCallStatus.INTERRUPTED,
                interrupt=pause.metadata,
                finished_at=finished,
                deadline=finished + timedelta(seconds=timeout) if timeout else None,
            )
            return _Result(interrupt=pause.metadata)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = error_of(exc)
            if not isinstance(exc, AgentError):
                error = TurnError(
                    status="INTERNAL", message=f"Tool '{row.name}' failed: {error.message}"
                )
            await self._record(row, status=ToolCallStatus.FAILED, error=error, finished_at=_now())
            if isinstance(exc, TransientError):
                raise
            raise ToolError(error.message, status=error.status) from exc
        await self._record(row, status=ToolCallStatus.DONE, output=output, finished_at=_now())
        return _Result(output=output)

    async def _close_round(
        self, number: int, model_message: Message, results: Mapping[str, _Result]
    ) -> list[Message] | None:
        """Commit the round: ``[model, tool]`` when every call finished (returned), or the
        model message annotated with ``interrupt``/``pendingOutput`` when any paused (None)."""
        if any(r.paused for r in results.values()):
            annotated = model_message.model_copy(deep=True)
            for part in annotated.content:
                request = part.tool_request
                if request is None or request.ref is None or request.ref not in results:
                    continue
                result = results[request.ref]
                meta = part.meta()
                meta.pop(RESOLVED_INTERRUPT, None)
                meta.pop(RESUMED, None)
                if result.paused:
                    meta.pop(PENDING_OUTPUT, None)
                    meta[INTERRUPT] = result.interrupt
                else:
                    meta[PENDING_OUTPUT] = result.output
                part.metadata = meta
            await self._save(number, [annotated], committed=True)
            return None
        responses: list[Part] = []
        for part in model_message.content:
            request = part.tool_request
            if request is None:
                continue
            result = results[str(request.ref)]
            responses.append(
                Part.of_response(request.name, request.ref, result.output, result.response_meta)
            )
        tool_message = Message(role="tool", content=responses)
        if number == 0:
            tool_message.metadata = {RESUMED: True}
        await self._save(number, [model_message, tool_message], committed=True)
        await self._emitter.emit("tool", responses)
        return [model_message, tool_message]

    async def _save(
        self,
        number: int,
        messages: list[Message],
        *,
        committed: bool,
        calls: list[ToolCallRecord] | None = None,
        usage: ModelUsage | None = None,
    ) -> None:
        await self.store.save_round(
            self.turn.id,
            lease_token=self.lease,
            round=RoundRecord(round=number, messages=messages, committed=committed),
            calls=calls or [],
            usage=usage,
        )

    # -- resume (round 0) -----------------------------------------------------------

    async def _resume_round(
        self, paused: Message, calls: Mapping[tuple[int, str], ToolCallRecord]
    ) -> TurnOutcome | None:
        """Answer the parent's paused message: replay kept outputs, take responds, run
        restarts. Returns an outcome when a restarted call paused again."""
        assert self.turn.parent_id is not None
        parent_calls = await self.store.list_calls(self.turn.parent_id)
        plan = plan_resume(
            snapshot_id=self.turn.parent_id,
            last_message=paused,
            journal=parent_calls,
            respond=self.turn.input.respond,
            restart=self.turn.input.restart,
            tools=self.config.tools,
            require_pending=False,
        )
        origin = {c.ref: c for c in parent_calls}
        amended = paused.model_copy(deep=True)
        results: dict[str, _Result] = {}
        rows: list[ToolCallRecord] = []
        restarts: dict[str, Any] = {}
        to_run: list[Part] = []
        for index, part in enumerate(amended.content):
            request = part.tool_request
            if request is None or request.ref is None:
                continue
            meta = part.meta()
            key = (
                origin[request.ref].idempotency_key
                if request.ref in origin
                else self._key(request.ref)
            )
            row = ToolCallRecord(
                turn_id=self.turn.id,
                round=0,
                ref=request.ref,
                name=request.name,
                input=request.input,
                status=ToolCallStatus.REQUESTED,
                idempotency_key=key,
            )
            if PENDING_OUTPUT in meta:
                results[request.ref] = _Result(
                    output=meta[PENDING_OUTPUT], response_meta={SOURCE: "pending"}
                )
                amended.content[index] = strip_pending(part)
                rows.append(
                    row.model_copy(
                        update={"status": ToolCallStatus.DONE, "output": meta[PENDING_OUTPUT]}
                    )
                )
                continue
            kind, value = plan.answers[request.ref]
            meta[RESOLVED_INTERRUPT] = meta.pop(INTERRUPT, True)
            part.metadata = meta
            if kind == "respond":
                results[request.ref] = _Result(output=value)
                rows.append(
                    row.model_copy(
                        update={
                            "status": ToolCallStatus.DONE,
                            "output": value,
                            "answer": {"respond": value},
                        }
                    )
                )
            else:
                restarts[request.ref] = value
                to_run.append(part)
                rows.append(row.model_copy(update={"answer": {"restart": value}}))
        existing = {key: c for key, c in calls.items() if key[0] == 0}
        fresh = [r for r in rows if (0, r.ref) not in existing]
        await self._save(0, [amended], committed=False, calls=fresh)
        calls_now = {**{(0, r.ref): r for r in rows}, **existing}
        results.update(await self._run_calls(0, to_run, calls_now, restarts))
        closed = await self._close_round(0, amended, results)
        if closed is None:
            return TurnOutcome(TurnStatus.COMPLETED, FinishReason.INTERRUPTED)
        return None
