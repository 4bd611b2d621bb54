"""The round loop of one turn, driven by the store's journal.

The runner rebuilds its position from what the store holds — committed rounds, the open
round's model message, the tool-call journal — so the same code runs a fresh turn and
continues one whose worker died: finished rounds and finished calls are never repeated, a
call that had started but not finished runs again with the same idempotency key (or, for a
tool declared non-idempotent, pauses the turn to ask a human whether the effect happened).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from engine.conversation.parts import (
    INTERRUPT,
    PENDING_OUTPUT,
    REJECTED,
    RESOLVED_INTERRUPT,
    RESUMED,
    SOURCE,
    TOOL_ERROR,
    Message,
    Part,
    paused_calls,
)
from engine.conversation.schemas import SchemaSpec
from engine.conversation.session_state import LiveState, SessionData
from engine.errors import AgentError, NotFoundError, StoreError, ToolError, TransientError
from engine.model import Model, ModelRequest, ModelUsage
from engine.rejection import REJECT, refusal_output
from engine.response import AgentChunk, ChunkEmitter
from engine.status import FinishReason, TurnStatus
from engine.store import (
    ClaimedTurn,
    RoundRecord,
    SessionStore,
    ToolCallRecord,
    ToolCallStatus,
    TurnError,
)
from engine.telemetry import instruments, tracing
from engine.tools import Tool, ToolContext, ToolInterrupt, malformed_call_reason
from engine.turns.outcome import TurnOutcome, error_of
from engine.turns.resume import edited_key, plan_resume, strip_pending
from engine.turns.writes import RoundWriter

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
    #: The pydantic model (or JSON schema) the session's custom state must match.
    state_schema: SchemaSpec = None
    #: The generation config every model call carries (Genkit's names: ``temperature``...).
    model_config: Mapping[str, Any] = field(default_factory=dict)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Result:
    """One call's result within a round: an output, or a pause with metadata.

    ``journal`` is the call's final journal row when its write was deferred to the round's
    close (see :meth:`TurnRunner._run_calls`).
    """

    output: Any = None
    interrupt: Any = None
    response_meta: dict[str, Any] | None = None
    journal: ToolCallRecord | None = None

    @property
    def paused(self) -> bool:
        return self.interrupt is not None


class TurnRunner:
    """Runs one claimed turn to an outcome; every write is fenced by ``lease_token``."""

    def __init__(
        self,
        config: RunnerConfig,
        store: SessionStore,
        claimed: ClaimedTurn,
        on_chunk: ChunkCallback | None = None,
    ) -> None:
        self.config = config
        self.store = store
        turn = self.turn = claimed.turn
        #: Everything the run reads, returned by the claim: no read between the claim and
        #: the first model call.
        self._progress = claimed.progress
        self._emitter = ChunkEmitter(on_chunk)
        self._used_refs: set[str] = set()
        #: Calls this attempt journaled ``running`` when it opened their round.
        self._started: set[tuple[int, str]] = set()
        #: The parent's journal, read with the rest of the turn's progress: a resume's
        #: answers are in it (rows a settled turn never changes once answered).
        self._parent_journal: list[ToolCallRecord] = []
        #: The session's custom state and artifacts, from the turn's last committed round.
        self._state = LiveState(SessionData.of(turn.custom, turn.artifacts), config.state_schema)
        self._writes = RoundWriter(store, turn.id, turn.lease_token, self._state.take_changed)

    async def run(self) -> TurnOutcome:
        """Run (or continue) the turn; returns its outcome, raises only on cancellation."""
        try:
            outcome = await self._run()
        except StoreError:
            # Not the turn's fault (lost lease, database down): the executor decides; the turn
            # stays pending and is recovered from its journal by whoever holds it next.
            raise
        except asyncio.CancelledError:
            # Aborted or handed back: what the turn completed stays completed.
            with contextlib.suppress(Exception):
                await self._writes.flush()
            raise
        except (ToolError, NotFoundError, AgentError) as exc:
            outcome = self._failed(exc)
        except TransientError as exc:
            outcome = self._failed(exc, transient=True)
        except Exception as exc:  # a tool or model bug must fail the turn, not the worker
            logger.exception("turn %s failed", self.turn.id)
            outcome = self._failed(exc)
        await self._writes.flush()
        return outcome

    def _failed(self, exc: BaseException, *, transient: bool = False) -> TurnOutcome:
        # Carries the usage of a model call whose round was never written, so it is counted.
        return TurnOutcome(
            TurnStatus.FAILED,
            FinishReason.FAILED,
            error_of(exc),
            transient=transient,
            usage=self._writes.take_usage(None),
        )

    async def _run(self) -> TurnOutcome:
        turn, progress = self.turn, self._progress
        self._parent_journal = progress.parent_journal
        history = progress.parent_conversation[: turn.history_length]
        rounds = {r.round: r for r in progress.rounds}
        calls = {(c.round, c.ref): c for c in progress.journal}
        for message in progress.parent_conversation:
            self._note_refs(message)
        for saved in rounds.values():
            for message in saved.messages:
                self._note_refs(message)
        self._replay_effects(progress.journal, rounds)
        begun = await self._begin(progress.parent_conversation, rounds, calls)
        if isinstance(begun, TurnOutcome):
            return begun
        calls = begun
        if 0 in rounds and rounds[0].committed:
            history.extend(rounds[0].messages)
        return await self._rounds(history, rounds, calls)

    def _replay_effects(
        self, journal: Sequence[ToolCallRecord], rounds: Mapping[int, RoundRecord]
    ) -> None:
        """Apply what the finished calls of rounds not committed yet did to the session state
        (the turn's stored state is its last committed round's): those calls are not run
        again, and their round commits with their changes."""
        finished = [
            c
            for c in journal
            if c.effects
            and not (c.round in rounds and rounds[c.round].committed)
            and c.status in (ToolCallStatus.DONE, ToolCallStatus.INTERRUPTED)
        ]
        finished.sort(key=lambda c: (c.finished_at or datetime.max.replace(tzinfo=UTC), c.ref))
        for call in finished:
            self._state.replay(call.effects or [])

    async def _begin(
        self,
        parent_conversation: list[Message],
        rounds: dict[int, RoundRecord],
        calls: dict[tuple[int, str], ToolCallRecord],
    ) -> dict[tuple[int, str], ToolCallRecord] | TurnOutcome:
        """What the turn's input does before its model rounds: a retry adopts its parent's
        open round, an expiry fails, a resume answers the paused message as round 0 (which
        may pause again). Updates ``rounds``; returns the journal, or the turn's outcome."""
        turn = self.turn
        if turn.input.kind == "retry" and not rounds and turn.parent_id is not None:
            adopted = await self._adopt_open_round(turn.parent_id)
            if adopted is not None:
                rounds[1], adopted_calls = adopted
                self._replay_effects(adopted_calls, rounds)
                return {(c.round, c.ref): c for c in adopted_calls}
        if turn.input.kind == "expire":
            raise AgentError(turn.input.reason or "Approval expired.", status="DEADLINE_EXCEEDED")
        if turn.input.kind != "resume":
            return calls
        done = rounds.get(0)
        if done is not None and done.committed:
            if paused_calls(done.messages[-1]):
                return TurnOutcome(TurnStatus.COMPLETED, FinishReason.INTERRUPTED)
            return calls
        # A registered migration may have rewritten the paused message (engine.state.pinning).
        paused = turn.input.paused or parent_conversation[turn.history_length]
        with tracing.round_span(0):
            resumed = await self._resume_round(paused, calls)
        if isinstance(resumed, TurnOutcome):
            return resumed
        # Exactly what _resume_round just committed: no need to read it back.
        rounds[0] = RoundRecord(round=0, messages=resumed, committed=True)
        return calls

    async def _rounds(
        self,
        history: list[Message],
        rounds: Mapping[int, RoundRecord],
        calls: dict[tuple[int, str], ToolCallRecord],
    ) -> TurnOutcome:
        """The model rounds from round 1: committed ones replayed into ``history``, an open
        one continued (its model message kept), then new ones until the model stops."""
        number = 1
        while True:
            record = rounds.get(number)
            if record is not None and record.committed:
                history.extend(record.messages)
                last = record.messages[-1]
                if last.role == "model":
                    reason = FinishReason.INTERRUPTED if paused_calls(last) else FinishReason.STOP
                    return TurnOutcome(TurnStatus.COMPLETED, reason)
                number += 1
                continue
            with tracing.round_span(number):
                ran = await self._round(number, record, history, calls)
            if isinstance(ran, TurnOutcome):
                return ran
            history.extend(ran)
            number += 1

    async def _round(
        self,
        number: int,
        record: RoundRecord | None,
        history: list[Message],
        calls: dict[tuple[int, str], ToolCallRecord],
    ) -> list[Message] | TurnOutcome:
        """Run round ``number`` (``record``: its open round, when continued): the messages it
        committed, or the turn's outcome when it ended the turn."""
        if record is not None:
            # Recovery: the model already answered this round; never ask it again.
            model_message, finish, usage = record.messages[0], FinishReason.STOP, None
        else:
            model_message, finish, usage = await self._call_model(history)
        requests = model_message.tool_requests
        if not requests:
            # Saved by the executor with the settling transition (one commit).
            return TurnOutcome(
                TurnStatus.COMPLETED,
                finish,
                last_round=RoundRecord(
                    round=number,
                    messages=[model_message],
                    committed=True,
                    state=self._state.take_changed(),
                ),
                usage=usage,
            )
        if number > self.config.max_turns:
            raise AgentError(
                f"Exceeded maximum tool call iterations ({self.config.max_turns})",
                status="ABORTED",
            )
        if record is None:
            calls.update(await self._open_round(number, model_message, requests, usage))
        results = await self._run_calls(number, requests, calls, restarts={})
        closed = await self._close_round(number, model_message, results)
        if isinstance(closed, TurnOutcome):
            return replace(closed, usage=self._writes.take_usage(None))
        return closed

    async def _open_round(
        self, number: int, model_message: Message, requests: list[Part], usage: ModelUsage | None
    ) -> dict[tuple[int, str], ToolCallRecord]:
        """Journal a new round's calls (with its model message, before any runs); the rows."""
        opened = [self._opening(number, p) for p in requests]
        if self._only_pauses(requests):
            # Nothing runs before the settle writes this round: a crash in between loses
            # only the model's answer (asked again), never a tool's effect.
            self._writes.unsaved_usage = usage
        else:
            await self._writes.save(
                number, [model_message], committed=False, calls=opened, usage=usage
            )
        return {(number, row.ref): row for row in opened}

    async def _adopt_open_round(
        self, parent_id: str
    ) -> tuple[RoundRecord, list[ToolCallRecord]] | None:
        """Continue the round the failed or aborted parent left open, as crash recovery
        continues a turn's own: its model message becomes this turn's first round and its
        journal rows come along with their idempotency keys, so a finished call is not run
        again, a started one re-runs under the same key (or, not idempotent, asks a human)
        and the model is not asked again for a round whose calls may have had an effect.

        ``None`` when the parent left no open round (it settled at a round boundary)."""
        saved = await self.store.load_rounds(parent_id)
        if not saved or saved[-1].committed or not saved[-1].messages:
            return None
        open_round = saved[-1]
        model_message = open_round.messages[0].copy_deep()
        if model_message.role != "model" or not model_message.tool_requests:
            return None
        rows = [
            _adopted(call, self.turn.id)
            for call in self._parent_journal
            if call.round == open_round.round
        ]
        await self._writes.save(1, [model_message], committed=False, calls=rows)
        logger.info(
            "turn %s continues the open round %d of %s (%d journaled calls)",
            self.turn.id,
            open_round.round,
            parent_id,
            len(rows),
        )
        return RoundRecord(round=1, messages=[model_message], committed=False), rows

    # -- model ------------------------------------------------------------------------

    async def _call_model(
        self, history: list[Message]
    ) -> tuple[Message, FinishReason, ModelUsage | None]:
        messages = list(history)
        if self.config.system:
            messages.insert(0, Message(role="system", content=[Part.of_text(self.config.system)]))
        request = ModelRequest(
            messages=messages,
            tools=[t.spec() for t in self.config.tools.values()],
            config=dict(self.config.model_config),
        )

        async def forward(parts: list[Part]) -> None:
            await self._emitter.emit("model", parts)

        model_name = self.config.model.name
        started = time.monotonic()
        try:
            with tracing.model_span(model_name) as span:
                response = await self.config.model.generate(request, forward)
                tracing.model_answered(span, response.finish_reason, response.usage)
        except BaseException as exc:
            took = time.monotonic() - started
            instruments.model_call(self.config.agent, model_name, took, instruments.error_kind(exc))
            raise
        instruments.model_call(self.config.agent, model_name, time.monotonic() - started, None)
        message = response.message.copy_deep()  # the model may keep what it returned
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

    def _opening(self, number: int, part: Part) -> ToolCallRecord:
        """The journal row written when a round opens: ``running`` already for an idempotent
        tool (it starts right after this write, and after a crash ``requested`` and
        ``running`` lead to the same re-run under the same key, so a separate "started" write
        buys nothing); ``requested`` for a non-idempotent one, whose ``running`` row must mean
        that it really started (recovery asks a human then)."""
        row = self._requested(number, part)
        tool = self._tool(row.name)
        if not tool.idempotent or malformed_call_reason(tool, part) is not None:
            return row  # a malformed call never starts: it is answered with a tool error
        self._started.add((number, row.ref))
        return row.model_copy(update={"status": ToolCallStatus.RUNNING, "started_at": _now()})

    def _only_pauses(self, requests: list[Part]) -> bool:
        """Whether the round is one well-formed call of an interrupt (which never executes,
        so its round can be written with the settle instead of when it opens)."""
        if len(requests) != 1 or requests[0].tool_request is None:
            return False
        tool = self._tool(requests[0].tool_request.name)
        return tool.is_interrupt and malformed_call_reason(tool, requests[0]) is None

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
        """Run the round's calls concurrently, reusing whatever the journal already holds.

        When one call is left to run, its final journal row (done or interrupted) is not
        written on its own: the round's close follows at once and writes it in the same
        transaction. The window in which a crash loses that row is the same as before (after
        the tool returned, before the write), so recovery is unchanged. With several calls a
        finished one is written at once, so a crash while a sibling runs never repeats it.
        """
        results: dict[str, _Result] = {}
        pending: list[tuple[Part, ToolCallRecord]] = []
        for part in requests:
            request = part.tool_request
            assert request is not None and request.ref is not None
            tool = self._tool(request.name)
            row = calls.get((number, request.ref)) or self._requested(number, part)
            rejection = malformed_call_reason(tool, part)
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
        defer = len(pending) == 1
        outcomes = await asyncio.gather(
            *(
                self._execute(row, restarts.get(row.ref, row.resumed), defer=defer)
                for _, row in pending
            ),
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
        await self._writes.record(updated)
        return updated

    async def _execute(self, row: ToolCallRecord, resumed: Any, *, defer: bool) -> _Result:
        started = time.monotonic()
        try:
            with tracing.tool_span(row) as span:
                result = await self._execute_call(row, resumed, defer=defer)
                outcome = "interrupted" if result.paused else "done"
                tracing.tool_finished(span, outcome)
        except BaseException as exc:
            took = time.monotonic() - started
            instruments.tool_call(self.config.agent, row.name, took, instruments.error_kind(exc))
            raise
        instruments.tool_call(self.config.agent, row.name, time.monotonic() - started, outcome)
        return result

    async def _execute_call(self, row: ToolCallRecord, resumed: Any, *, defer: bool) -> _Result:
        tool = self._tool(row.name)
        if (row.round, row.ref) in self._started and row.status is ToolCallStatus.RUNNING:
            pass  # journaled running when its round opened (see _opening)
        else:
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
            session=self._state,
        )
        try:
            output = await tool.invoke(row.input, ctx)
        except ToolInterrupt as pause:
            await self._stream_state()
            finished = _now()
            timeout = getattr(tool, "expires_after", None)
            paused = row.model_copy(
                update={
                    "status": ToolCallStatus.INTERRUPTED,
                    "interrupt": pause.metadata,
                    "finished_at": finished,
                    "deadline": finished + timedelta(seconds=timeout) if timeout else None,
                    "effects": ctx.effects or None,
                }
            )
            if defer:
                return _Result(interrupt=pause.metadata, journal=paused)
            await self._writes.record(paused)
            return _Result(interrupt=pause.metadata)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._stream_state()
            error = error_of(exc)
            if not isinstance(exc, AgentError):
                error = TurnError(
                    status="INTERNAL", message=f"Tool '{row.name}' failed: {error.message}"
                )
            await self._record(row, status=ToolCallStatus.FAILED, error=error, finished_at=_now())
            if isinstance(exc, TransientError):
                raise
            raise ToolError(error.message, status=error.status) from exc
        await self._stream_state()
        done = row.model_copy(
            update={
                "status": ToolCallStatus.DONE,
                "output": output,
                "finished_at": _now(),
                "effects": ctx.effects or None,
            }
        )
        if defer:
            return _Result(output=output, journal=done)
        await self._writes.record(done)
        return _Result(output=output)

    async def _close_round(
        self,
        number: int,
        model_message: Message,
        results: Mapping[str, _Result],
        calls: Sequence[ToolCallRecord] = (),
        *,
        defer: bool = False,
    ) -> list[Message] | TurnOutcome:
        """Commit the round: ``[model, tool]`` when every call finished (returned), or — when
        any paused — the outcome ``completed/interrupted`` carrying the model message
        annotated with ``interrupt``/``pendingOutput``, which the executor saves with the
        settling transition. ``calls`` and the deferred rows of ``results`` are written with
        the round."""
        rows = [*calls, *(r.journal for r in results.values() if r.journal is not None)]
        if any(r.paused for r in results.values()):
            annotated = model_message.copy_deep()
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
            return TurnOutcome(
                TurnStatus.COMPLETED,
                FinishReason.INTERRUPTED,
                last_round=RoundRecord(
                    round=number,
                    messages=[annotated],
                    committed=True,
                    state=self._state.take_changed(),
                ),
                last_calls=tuple(rows),
            )
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
        if defer:
            # It ran nothing, so a crash before it is written loses nothing: the next
            # attempt builds the same round again from the turn's input.
            closed = RoundRecord(
                round=number,
                messages=[model_message, tool_message],
                committed=True,
                state=self._state.take_changed(),
            )
            self._writes.defer(closed, rows)
        else:
            await self._writes.save(
                number, [model_message, tool_message], committed=True, calls=rows
            )
        await self._emitter.emit("tool", responses)
        return [model_message, tool_message]

    async def _stream_state(self) -> None:
        """Stream the session-state changes made so far (``customPatch`` / ``artifact``)."""
        for chunk in self._state.take_chunks():
            await self._emitter.emit_state(chunk)

    # -- resume (round 0) -----------------------------------------------------------

    async def _resume_round(
        self, paused: Message, calls: Mapping[tuple[int, str], ToolCallRecord]
    ) -> list[Message] | TurnOutcome:
        """Answer the parent's paused message: replay kept outputs, take responds, run
        restarts. Returns round 0's committed messages, or an outcome when a restarted call
        paused again."""
        assert self.turn.parent_id is not None
        parent_calls = self._parent_journal
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
            edit = plan.edits.get(request.ref)
            if edit is not None:
                # The approver's edit replaces the call: the model sees, and the tool runs
                # with, the edited arguments, under a key of their own.
                request.input = edit["input"]
                row = row.model_copy(
                    update={
                        "input": edit["input"],
                        "idempotency_key": edited_key(key, edit["input"]),
                    }
                )
            if kind == REJECT:
                # The approver said no: the refusal answers the call and the tool never runs.
                refusal = refusal_output(value)
                results[request.ref] = _Result(output=refusal, response_meta={REJECTED: value})
                rows.append(
                    row.model_copy(
                        update={
                            "status": ToolCallStatus.DONE,
                            "output": refusal,
                            "answer": {REJECT: value},
                        }
                    )
                )
            elif kind == "respond":
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
                rows.append(row.model_copy(update={"answer": plan.answer_of(request.ref)}))
        existing = {key: c for key, c in calls.items() if key[0] == 0}
        fresh = [r for r in rows if (0, r.ref) not in existing]
        if not to_run:
            # Nothing to run (every call answered by respond or kept output): round 0 is
            # closed at once, and written with its journal rows by the turn's next write
            # (usually the next round's opening, in the same statement).
            return await self._close_round(0, amended, results, calls=fresh, defer=True)
        await self._writes.save(0, [amended], committed=False, calls=fresh)
        calls_now = {**{(0, r.ref): r for r in rows}, **existing}
        results.update(await self._run_calls(0, to_run, calls_now, restarts))
        return await self._close_round(0, amended, results)


def _adopted(call: ToolCallRecord, turn_id: str) -> ToolCallRecord:
    """``call`` of a parent's open round as a journal row of round 1 of ``turn_id``: same
    ref, input and idempotency key; a call that failed is run again (that is the retry)."""
    changes: dict[str, Any] = {"turn_id": turn_id, "round": 1}
    if call.status is ToolCallStatus.FAILED:
        changes.update(status=ToolCallStatus.REQUESTED, error=None, finished_at=None)
    return call.model_copy(update=changes, deep=True)
