"""The chat handle: ``send``/``resume`` (and their streaming forms) and ``abort``.

The chat knows the agent only as :class:`ChatAgent`, the two calls it makes, so the agent
module can build chats without the two modules importing each other.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.conversation.parts import Message, Part
from engine.conversation.session_state import Artifact
from engine.errors import SessionBusyError, TurnFailedError, TurnTimeoutError
from engine.response import AgentChunk, AgentResponse
from engine.state.snapshots import coerce_message, coerce_part
from engine.status import TurnStatus
from engine.store import AbortOutcome, SessionStore, StoredSnapshot, TurnInput, TurnRecord
from engine.turns.request import TurnRequest

__all__ = [
    "END_OF_STREAM",
    "AgentTurn",
    "Chat",
    "ChatAPI",
    "ChatAgent",
    "MessageLike",
    "TurnCall",
]

MessageLike = str | Message | Sequence[Part] | Mapping[str, Any]
ChunkSink = Callable[[AgentChunk], Awaitable[None]]

#: Put on an :class:`AgentTurn`'s queue after the last chunk.
END_OF_STREAM = object()


class ChatAgent(Protocol):
    """What a :class:`Chat` asks of its agent (:class:`engine.Agent` is one)."""

    async def run_turn(
        self,
        request: TurnRequest,
        *,
        on_chunk: ChunkSink | None = None,
        on_started: Any = None,
        wait: bool = True,
        timeout: float | None = None,
    ) -> AgentResponse: ...

    async def abort_in(self, store: SessionStore, turn_id: str) -> AbortOutcome: ...


class AgentTurn:
    """A streaming turn: iterate :attr:`stream` for chunks, await :attr:`response`.

    Awaiting the turn itself is the same as awaiting :attr:`response`.
    """

    def __init__(self, queue: asyncio.Queue[object], task: asyncio.Task[AgentResponse]) -> None:
        self._queue = queue
        self._task = task
        self._stream = self._iterate()

    @property
    def response(self) -> asyncio.Task[AgentResponse]:
        """The final response (equal to what the non-streaming call returns)."""
        return self._task

    @property
    def stream(self) -> AsyncIterator[AgentChunk]:
        """The chunks, as the model produces them; ends when the turn settles.

        There is one stream per turn: every access returns the same iterator.
        """
        return self._stream

    async def _iterate(self) -> AsyncIterator[AgentChunk]:
        while True:
            item = await self._queue.get()
            if item is END_OF_STREAM:
                return
            assert isinstance(item, AgentChunk)
            yield item

    def __await__(self) -> Generator[Any, None, AgentResponse]:
        return self._task.__await__()


@dataclass(frozen=True)
class TurnCall:
    """One ``send`` or ``resume`` as a chat runs it: the message or the answers to the
    paused interrupts, where chunks go (``None``: not streamed), and the call's options."""

    message: MessageLike | None
    resume: Mapping[str, Sequence[Part]] | None
    sink: ChunkSink | None = None
    wait: bool = True
    idempotency_key: str | None = None
    timeout: float | None = None


class ChatAPI(ABC):
    """What every chat offers — a local :class:`Chat` and a remote one alike: ``send`` and
    ``resume``, their streaming forms, one turn at a time. Subclasses run one turn in
    :meth:`_turn`.

    A chat opens on a session id, a snapshot id or a client-managed state blob (whose
    session it then continues), or on nothing: a new session.
    """

    _busy = False

    def __init__(
        self,
        *,
        session_id: str | None,
        snapshot_id: str | None,
        state: Mapping[str, Any] | None,
    ) -> None:
        self.session_id = session_id
        self.snapshot_id = snapshot_id
        self.state: dict[str, Any] | None = dict(state) if state is not None else None
        if self.state is not None:
            self.session_id = str(self.state.get("sessionId"))
        #: The session's custom state as this chat knows it (the blob's, until a turn ends).
        self.custom: Any = self.state.get("custom") if self.state is not None else None

    # -- sending --------------------------------------------------------------------------

    async def send(
        self,
        message: MessageLike | None = None,
        *,
        resume: Mapping[str, Sequence[Part]] | None = None,
        wait: bool = True,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> AgentResponse:
        """Send a user message (or, with ``resume``, answer the paused interrupts).

        ``send()`` with neither retries from the current snapshot (a failed or aborted turn
        holds the conversation up to its last completed round). With ``wait=False`` (agents
        whose turns run in workers) the call returns the ``pending`` snapshot at once;
        ``agent.wait(snapshot_id)`` later returns its settled response.

        ``timeout`` (seconds) bounds the wait: past it
        :class:`~engine.errors.TurnTimeoutError` is raised, the turn is left pending (queued
        or running) and the chat points at it as after ``wait=False``. Without a timeout a
        queued turn is waited for as long as it takes; one that no worker claims is logged
        (a warning, see ``docs/operations.md``).

        ``idempotency_key`` (agents with a store): sending the same request again under the
        same key — after a timeout or a lost answer — answers with the turn the first one
        created rather than creating a second; another request under it is refused.
        """
        return await self._guarded(TurnCall(message, resume, None, wait, idempotency_key, timeout))

    def send_stream(
        self,
        message: MessageLike | None = None,
        *,
        resume: Mapping[str, Sequence[Part]] | None = None,
    ) -> AgentTurn:
        """Like :meth:`send`, streaming the model's chunks as they are produced."""
        queue: asyncio.Queue[object] = asyncio.Queue()

        async def sink(chunk: AgentChunk) -> None:
            queue.put_nowait(chunk)

        async def run() -> AgentResponse:
            try:
                return await self._guarded(TurnCall(message, resume, sink))
            finally:
                queue.put_nowait(END_OF_STREAM)

        return AgentTurn(queue, asyncio.create_task(run()))

    async def resume(
        self,
        *,
        respond: Sequence[Part] = (),
        restart: Sequence[Part] = (),
        wait: bool = True,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> AgentResponse:
        """Answer the paused interrupts: sugar for ``send(resume={...})``."""
        return await self.send(
            resume={"respond": respond, "restart": restart},
            wait=wait,
            idempotency_key=idempotency_key,
            timeout=timeout,
        )

    def resume_stream(
        self, *, respond: Sequence[Part] = (), restart: Sequence[Part] = ()
    ) -> AgentTurn:
        """Streaming :meth:`resume`."""
        return self.send_stream(resume={"respond": respond, "restart": restart})

    async def _guarded(self, call: TurnCall) -> AgentResponse:
        if self._busy:
            raise SessionBusyError(
                "This chat already has a turn in flight; wait for it (or abort it) first.",
                snapshot_id=self.snapshot_id,
            )
        self._busy = True
        try:
            return await self._turn(call)
        finally:
            self._busy = False

    @abstractmethod
    async def _turn(self, call: TurnCall) -> AgentResponse:
        """Run one turn (the busy guard is already held)."""


class Chat(ChatAPI):
    """One conversation with an agent.

    The chat follows the session: after each turn it points at the new snapshot (or, with
    client-managed state, holds the new signed state blob), so ``resume`` continues exactly
    where the previous turn paused. One turn at a time: a second ``send`` while one is in
    flight raises :class:`~engine.errors.SessionBusyError`.
    """

    def __init__(
        self,
        agent: ChatAgent,
        *,
        session_id: str | None = None,
        snapshot_id: str | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(session_id=session_id, snapshot_id=snapshot_id, state=state)
        self.agent = agent
        #: The session's artifacts as of the last settled turn.
        self.artifacts: list[Artifact] = []
        self._running: tuple[SessionStore, TurnRecord] | None = None
        #: The snapshot the chat points at, as its last answer read it settled.
        self._seen: StoredSnapshot | None = None

    @property
    def pending_snapshot_id(self) -> str | None:
        """The id of this chat's turn in flight (``None`` when idle)."""
        return self._running[1].id if self._running is not None else None

    async def abort(self) -> TurnStatus | None:
        """Abort this chat's turn in flight; returns its status before the abort (``None``
        when there is none). The turn settles ``aborted`` and the pending send raises."""
        if self._running is None:
            return None
        store, turn = self._running
        return (await self.agent.abort_in(store, turn.id)).previous

    # -- internals ----------------------------------------------------------------------

    def _input(
        self, message: MessageLike | None, resume: Mapping[str, Sequence[Part]] | None
    ) -> TurnInput:
        user = coerce_message(message)
        if resume is not None:
            respond = [coerce_part(p) for p in resume.get("respond", ()) or ()]
            restart = [coerce_part(p) for p in resume.get("restart", ()) or ()]
            return TurnInput(kind="resume", message=user, respond=respond, restart=restart)
        if user is not None:
            return TurnInput(kind="message", message=user)
        return TurnInput(kind="retry")

    async def _turn(self, call: TurnCall) -> AgentResponse:
        try:
            # Used once: a refused request reads the snapshot afresh next time.
            seen, self._seen = self._seen, None
            request = TurnRequest(
                input=self._input(call.message, call.resume),
                session_id=self.session_id,
                snapshot_id=self.snapshot_id,
                state=self.state,
                idempotency_key=call.idempotency_key,
                seen=seen,
            )

            def started(store: SessionStore, turn: TurnRecord) -> None:
                self._running = (store, turn)
                self.session_id = turn.session_id

            try:
                response = await self.agent.run_turn(
                    request,
                    on_chunk=call.sink,
                    on_started=started,
                    wait=call.wait,
                    timeout=call.timeout,
                )
            except TurnFailedError as failure:
                if isinstance(failure.response, AgentResponse):
                    self._follow(failure.response)
                raise
            except TurnTimeoutError as expired:
                # As after wait=False: the chat continues from the turn once it settles.
                if self.state is None and expired.snapshot_id is not None:
                    self.snapshot_id = expired.snapshot_id
                raise
            self._follow(response)
            return response
        finally:
            self._running = None

    def _follow(self, response: AgentResponse) -> None:
        self.session_id = response.session_id
        self.custom, self.artifacts = response.custom, list(response.artifacts)
        if response.state is not None:
            self.state = response.state
        else:
            self.snapshot_id = response.snapshot_id
            self._seen = response.stored
