"""A Python client for agents served over Genkit's wire protocol (ours or Genkit's own).

``remote_agent(url)`` returns an agent with the chat API of a local one — ``chat()``,
``send``/``send_stream``/``resume``/``resume_stream``/``abort``, interrupts with
``respond``/``restart``, ``get_snapshot``, ``abort``, ``wait`` — built on httpx. Errors come
back typed: the server names the error class in ``error.details.type`` and the client raises
the same engine error (by status alone for servers that do not, such as Genkit's).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import httpx

from engine import errors
from engine.chat import ChatAPI, ChunkSink, MessageLike, TurnCall
from engine.conversation.parts import Message, Part
from engine.conversation.schemas import Schema, SchemaSpec
from engine.conversation.session_state import Artifact, SessionData, apply_patch
from engine.errors import AgentError, InvalidArgumentError, TurnFailedError
from engine.remote.wire import IDEMPOTENCY_HEADER
from engine.response import (
    AgentChunk,
    AgentResponse,
    failed_turn,
    interrupts_of,
    refused_response,
)
from engine.state.snapshots import SessionSnapshot, coerce_message, coerce_part
from engine.status import ACTIVE_STATUSES, FinishReason, TurnStatus
from engine.store import AbortOutcome

__all__ = ["RemoteAgent", "RemoteChat", "RemoteProtocolError", "remote_agent"]

HeadersLike = Mapping[str, str] | Callable[[], Mapping[str, str]]

#: Error classes a server may name in ``details.type``, and the class per status otherwise.
_BY_NAME: dict[str, type[AgentError]] = {
    cls.__name__: cls
    for cls in (
        errors.InvalidArgumentError,
        errors.FailedPreconditionError,
        errors.NotFoundError,
        errors.ResumeValidationError,
        errors.SnapshotNotResumableError,
        errors.SessionBusyError,
        errors.ApprovalNotPendingError,
        errors.DecisionConflictError,
        errors.StaleSnapshotError,
        errors.InvalidStateError,
        errors.ToolError,
    )
}
_BY_STATUS: dict[str, type[AgentError]] = {
    "INVALID_ARGUMENT": errors.InvalidArgumentError,
    "FAILED_PRECONDITION": errors.FailedPreconditionError,
    "NOT_FOUND": errors.NotFoundError,
}


class RemoteProtocolError(AgentError):
    """The server answered something that is not Genkit's protocol (or not at all)."""

    default_status = "UNKNOWN"


def _error_from(wire: Mapping[str, Any], snapshot_id: str | None = None) -> AgentError:
    status = str(wire.get("status") or "UNKNOWN")
    message = str(wire.get("message") or "")
    details = wire.get("details")
    named = details.get("type") if isinstance(details, Mapping) else None
    cls = _BY_NAME.get(str(named)) or _BY_STATUS.get(status, AgentError)
    kept = None if named is not None and set(details or {}) == {"type"} else details
    return cls(message, status=status, details=kept, snapshot_id=snapshot_id)


def remote_agent(
    url: str,
    *,
    headers: HeadersLike | None = None,
    state_management: str | None = None,
    timeout: float = 300.0,
    transport: httpx.AsyncBaseTransport | None = None,
    interrupt_inputs: Mapping[str, SchemaSpec] | None = None,
    full_history: bool = True,
) -> RemoteAgent:
    """An agent served at ``url`` (e.g. ``http://host:8080/api/bankingAgent``).

    ``headers`` are sent with every request (a mapping, or a callable giving one per request,
    e.g. for a refreshed token). ``state_management`` (``"server"`` or ``"client"``) only
    presets what the first result would reveal anyway. ``interrupt_inputs`` maps interrupt
    names to their input models, so ``interrupt.input`` is typed as with a local agent. With
    ``full_history`` (the default) a server-managed chat reads the snapshot after each turn,
    so ``response.messages`` is the whole conversation, tool messages included, as locally
    (one more request per turn; Genkit's client only appends the final message).
    """
    if state_management not in (None, "server", "client"):
        raise ValueError("state_management must be 'server', 'client' or None.")
    return RemoteAgent(
        url.rstrip("/"),
        headers=headers,
        state_management=state_management,
        timeout=timeout,
        transport=transport,
        interrupt_inputs=interrupt_inputs,
        full_history=full_history,
    )


class RemoteAgent:
    """An agent on a server; create with :func:`remote_agent`."""

    def __init__(
        self,
        url: str,
        *,
        headers: HeadersLike | None,
        state_management: str | None,
        timeout: float,
        transport: httpx.AsyncBaseTransport | None,
        interrupt_inputs: Mapping[str, SchemaSpec] | None = None,
        full_history: bool = True,
    ) -> None:
        self.url = url
        self.full_history = full_history
        self.schemas = {name: Schema(spec) for name, spec in (interrupt_inputs or {}).items()}
        self.name = url.rsplit("/", 1)[-1]
        self.state_management = state_management
        self._headers = headers
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()

    async def __aenter__(self) -> RemoteAgent:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    def chat(
        self,
        *,
        session_id: str | None = None,
        snapshot_id: str | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> RemoteChat:
        """A conversation: new, or reopened by session id, snapshot id or state blob."""
        return RemoteChat(self, session_id=session_id, snapshot_id=snapshot_id, state=state)

    # -- plain calls -----------------------------------------------------------------------

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The headers of one request."""
        chosen = self._headers() if callable(self._headers) else (self._headers or {})
        return {"content-type": "application/json", **chosen, **(extra or {})}

    async def _call(self, suffix: str, data: Mapping[str, Any]) -> Any:
        try:
            response = await self._http.post(
                self.url + suffix, json={"data": dict(data)}, headers=self.headers()
            )
        except httpx.HTTPError as exc:
            raise RemoteProtocolError(f"{self.url}{suffix}: {exc}", status="UNAVAILABLE") from exc
        body = _json_of(response)
        if response.status_code != 200:
            raise _error_from(body if isinstance(body, Mapping) else {"message": response.text})
        if not isinstance(body, Mapping) or "result" not in body:
            raise RemoteProtocolError(f"{self.url}{suffix}: no result in {response.text[:200]!r}")
        return body["result"]

    async def get_snapshot(
        self, *, snapshot_id: str | None = None, session_id: str | None = None
    ) -> SessionSnapshot | None:
        """The snapshot with that id, or the session's latest; ``None`` if unknown."""
        if (snapshot_id is None) == (session_id is None):
            raise InvalidArgumentError("Give exactly one of snapshot_id and session_id.")
        selector = {"snapshotId": snapshot_id} if snapshot_id else {"sessionId": session_id}
        try:
            result = await self._call("/getSnapshot", selector)
        except errors.NotFoundError:
            return None
        return _snapshot_of(result)

    async def abort(self, snapshot_id: str) -> TurnStatus | None:
        """Abort a running turn; returns its status before the abort, as Genkit's abort
        does (``None`` for a snapshot the server does not know or does not show us)."""
        result = await self._call("/abort", {"snapshotId": snapshot_id})
        return TurnStatus(result["status"]) if result.get("status") else None

    async def request_abort(self, snapshot_id: str) -> AbortOutcome:
        """Abort a running turn; returns its status before and after, as the server reports
        them (:meth:`engine.agent.Agent.request_abort`). Raises
        :class:`~engine.errors.NotFoundError` for an unknown snapshot."""
        result = await self._call("/abort", {"snapshotId": snapshot_id})
        if not result.get("status"):
            raise errors.NotFoundError(f"Snapshot '{snapshot_id}' not found.")
        previous = TurnStatus(result["status"])
        return AbortOutcome(
            previous=previous, status=TurnStatus(result.get("resultingStatus") or previous)
        )

    async def wait(
        self, snapshot_id: str, *, timeout: float | None = None, poll_interval: float = 0.2
    ) -> AgentResponse:
        """Poll a (detached) snapshot until it settles; its response, or
        :class:`TurnFailedError` when it failed."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            snapshot = await self.get_snapshot(snapshot_id=snapshot_id)
            if snapshot is None:
                raise errors.NotFoundError(f"Snapshot '{snapshot_id}' not found.")
            if snapshot.status not in ACTIVE_STATUSES:
                return _response_of_snapshot(snapshot, self.schemas)
            if deadline is not None and loop.time() >= deadline:
                raise errors.TurnTimeoutError(
                    f"Snapshot {snapshot_id} did not settle within {timeout:g}s; it is still "
                    f"{snapshot.status.value} and left as it is. Wait again with "
                    f"wait({snapshot_id!r}), or stop it with abort({snapshot_id!r}).",
                    snapshot_id=snapshot_id,
                )
            await asyncio.sleep(poll_interval)

    # -- turns -----------------------------------------------------------------------------

    async def run(
        self,
        data: Mapping[str, Any],
        init: Mapping[str, Any],
        on_chunk: ChunkSink | None,
        idempotency_key: str | None = None,
        on_state: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> Mapping[str, Any]:
        """One turn over the streaming protocol; the ``result`` object. ``on_state`` sees
        every ``customPatch`` / ``artifact`` chunk, streamed to ``on_chunk`` or not."""
        body = {"data": dict(data), "init": dict(init)}
        extra = {"accept": "text/event-stream"}
        if idempotency_key is not None:
            extra[IDEMPOTENCY_HEADER] = idempotency_key
        headers = self.headers(extra)
        try:
            async with self._http.stream("POST", self.url, json=body, headers=headers) as reply:
                if reply.status_code != 200:
                    text = (await reply.aread()).decode(errors="replace")
                    parsed = _json_text(text)
                    raise _error_from(parsed if isinstance(parsed, Mapping) else {"message": text})
                async for kind, payload in _frames(reply.aiter_text()):
                    if kind == "message" and ("customPatch" in payload or "artifact" in payload):
                        if on_state is not None:
                            on_state(payload)
                        if on_chunk is not None:
                            await on_chunk(AgentChunk.from_wire(payload))
                    elif kind == "message":
                        body = payload.get("modelChunk")
                        # Genkit ends a paused turn with an index-less chunk repeating the
                        # paused requests; the response carries them, a local stream does not.
                        if on_chunk is not None and body is not None and "index" in body:
                            await on_chunk(AgentChunk.from_wire(payload))
                    elif kind == "result":
                        return dict(payload)
                    else:
                        raise _error_from(payload)
        except httpx.HTTPError as exc:
            raise RemoteProtocolError(f"{self.url}: {exc}", status="UNAVAILABLE") from exc
        raise RemoteProtocolError(f"{self.url}: the stream ended without a result.")


async def _frames(text: AsyncIterator[str]) -> AsyncIterator[tuple[str, Any]]:
    buffer = ""
    async for piece in text:
        buffer += piece
        while "\n\n" in buffer:
            raw, buffer = buffer.split("\n\n", 1)
            try:
                payload = json.loads(raw[6:])  # "data: " and "error:" are both 6 characters
            except json.JSONDecodeError as exc:
                raise RemoteProtocolError(f"Unreadable stream frame: {raw[:200]!r}") from exc
            if "message" in payload:
                yield "message", payload["message"]
            elif "result" in payload:
                yield "result", payload["result"]
            elif "error" in payload:
                yield "error", payload["error"]
            else:
                raise RemoteProtocolError(f"Unknown stream frame: {raw[:200]!r}")


def _json_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _json_of(response: httpx.Response) -> Any:
    return _json_text(response.text)


def _status_of(finish: FinishReason | None) -> TurnStatus:
    if finish is FinishReason.FAILED:
        return TurnStatus.FAILED
    if finish is FinishReason.ABORTED:
        return TurnStatus.ABORTED
    if finish is FinishReason.DETACHED:
        return TurnStatus.PENDING
    return TurnStatus.COMPLETED


def _snapshot_of(wire: Mapping[str, Any]) -> SessionSnapshot:
    state = dict(wire.get("state") or {})
    return SessionSnapshot.model_validate(
        {
            "snapshot_id": wire["snapshotId"],
            "session_id": wire.get("sessionId") or state.get("sessionId"),
            "parent_id": wire.get("parentId"),
            "created_at": wire["createdAt"],
            "updated_at": wire.get("updatedAt") or wire["createdAt"],
            "status": wire.get("status") or TurnStatus.COMPLETED,
            "finish_reason": wire.get("finishReason"),
            "error": wire.get("error"),
            "state": {
                "session_id": state.get("sessionId") or wire.get("sessionId"),
                "messages": state.get("messages") or [],
                "custom": state.get("custom"),
                "artifacts": state.get("artifacts") or [],
            },
        }
    )


def _response_of_snapshot(
    snapshot: SessionSnapshot, schemas: Mapping[str, Schema]
) -> AgentResponse:
    messages = snapshot.state.messages
    response = AgentResponse(
        session_id=snapshot.session_id,
        snapshot_id=snapshot.snapshot_id,
        status=snapshot.status,
        finish_reason=snapshot.finish_reason,
        messages=messages,
        interrupts=interrupts_of(messages[-1] if messages else None, schemas),
        custom=snapshot.state.custom,
        artifacts=SessionData.of(None, snapshot.state.artifacts).artifacts,
    )
    if snapshot.status is TurnStatus.FAILED:
        error = snapshot.error or {}
        raise failed_turn(
            response,
            str(error.get("message") or "The turn failed."),
            status=str(error.get("status") or "INTERNAL"),
            details=error.get("details"),
            snapshot_id=snapshot.snapshot_id,
        )
    return response


class RemoteChat(ChatAPI):
    """One conversation with a remote agent; the same API as :class:`engine.Chat`.

    Follows Genkit's client: after each turn the chat points at the returned snapshot (or
    holds the returned state blob) and sends it as ``init`` with the next turn.
    """

    def __init__(
        self,
        agent: RemoteAgent,
        *,
        session_id: str | None,
        snapshot_id: str | None,
        state: Mapping[str, Any] | None,
    ) -> None:
        super().__init__(session_id=session_id, snapshot_id=snapshot_id, state=state)
        self.agent = agent
        #: The conversation as this client knows it.
        self.messages: list[Message] = list(_state_messages(self.state))
        #: The session's artifacts (and ``custom``) as this client knows them: from the
        #: state blob, the snapshot, or (as Genkit's client does) the streamed patches.
        self.artifacts: list[Artifact] = (
            SessionData.of(None, self.state.get("artifacts")).artifacts if self.state else []
        )
        self._pending: str | None = None

    def _init(self) -> dict[str, Any]:
        """What the next send continues: where the chat is once it has a session (snapshot
        and session: refused if another send moved the session on), else what it was
        opened on (docs/decisions.md, "What a send continues")."""
        if self.snapshot_id is not None:
            if self.session_id is not None:
                return {"snapshotId": self.snapshot_id, "sessionId": self.session_id}
            return {"snapshotId": self.snapshot_id}
        if self.state is not None:
            return {"state": self.state}
        return {"sessionId": self.session_id} if self.session_id else {}

    @property
    def pending_snapshot_id(self) -> str | None:
        """The detached turn this chat started and has not seen settle (``None``: none)."""
        return self._pending

    async def abort(self) -> TurnStatus | None:
        """Abort this chat's detached turn; returns its status before the abort (``None``
        when there is none to abort)."""
        if self._pending is None:
            return None
        return await self.agent.abort(self._pending)

    async def wait(self, *, timeout: float | None = None) -> AgentResponse:
        """Wait for this chat's detached turn to settle, and follow it."""
        if self._pending is None:
            raise errors.FailedPreconditionError("This chat has no detached turn to wait for.")
        try:
            response = await self.agent.wait(self._pending, timeout=timeout)
        except TurnFailedError as failure:
            self._pending = None
            if failure.snapshot_id:
                self.snapshot_id = failure.snapshot_id
            raise
        self._pending = None
        self._follow_snapshot(response)
        return response

    # -- internals ---------------------------------------------------------------------------

    def _data(
        self, message: MessageLike | None, resume: Mapping[str, Sequence[Part]] | None, wait: bool
    ) -> tuple[dict[str, Any], Message | None]:
        user = coerce_message(message)
        data: dict[str, Any] = {}
        if user is not None:
            data["message"] = user.to_wire()
        if resume is not None:
            data["resume"] = {
                key: [coerce_part(p).to_wire() for p in resume.get(key, ()) or ()]
                for key in ("respond", "restart")
                if resume.get(key)
            }
        if not wait:
            data["detach"] = True
        return data, user

    async def _turn(self, call: TurnCall) -> AgentResponse:
        if call.timeout is not None and call.wait:
            # Detached, then polled: a streaming request given up would abort its turn,
            # and an expired timeout must leave it pending (needs an agent with a store).
            await self._turn(replace(call, sink=None, wait=False, timeout=None))
            return await self.wait(timeout=call.timeout)
        data, user = self._data(call.message, call.resume, call.wait)
        live = _PatchedState(self.custom)
        result = await self.agent.run(
            data, self._init(), call.sink, call.idempotency_key, on_state=live.apply
        )
        history = None
        settled = (
            result.get("snapshotId")
            and result.get("sessionId")  # refused requests carry none: nothing changed
            and "state" not in result
            and result.get("finishReason") != FinishReason.DETACHED.value
        )
        if self.agent.full_history and settled:
            snapshot = await self.agent.get_snapshot(snapshot_id=result["snapshotId"])
            history = snapshot.state.messages if snapshot is not None else None
            if snapshot is not None:
                live.custom, live.changed = snapshot.state.custom, True
        if live.changed:
            self.custom = live.custom
        return self._follow(result, user, history)

    def _follow(
        self,
        result: Mapping[str, Any],
        user: Message | None,
        history: list[Message] | None = None,
    ) -> AgentResponse:
        finish = FinishReason(result["finishReason"]) if result.get("finishReason") else None
        error_wire = result.get("error")
        if finish is FinishReason.FAILED and error_wire is not None and "sessionId" not in result:
            # Refused before the turn started: nothing changed on the server.
            refused = _error_from(error_wire, snapshot_id=result.get("snapshotId"))
            refused_response(refused, session_id=self.session_id)
            raise refused
        if result.get("sessionId"):
            self.session_id = str(result["sessionId"])
        if result.get("state") is not None:
            self.state = dict(result["state"])
            self.messages = list(_state_messages(self.state))
            self.custom = self.state.get("custom")
            self.artifacts = SessionData.of(None, self.state.get("artifacts")).artifacts
        elif history is not None:
            self.messages = list(history)
        else:
            if user is not None:
                self.messages.append(user)
            if result.get("message") is not None:
                self.messages.append(Message.model_validate(result["message"]))
        if result.get("state") is None and result.get("sessionId"):
            self.artifacts = SessionData.of(None, result.get("artifacts")).artifacts
        if finish is FinishReason.DETACHED:
            self._pending = result.get("snapshotId")
        elif result.get("snapshotId"):
            self.snapshot_id = str(result["snapshotId"])
        response = AgentResponse(
            session_id=str(result.get("sessionId") or self.session_id or ""),
            snapshot_id=result.get("snapshotId"),
            status=_status_of(finish),
            finish_reason=finish,
            messages=list(self.messages),
            interrupts=(
                interrupts_of(self.messages[-1] if self.messages else None, self.agent.schemas)
                if finish is FinishReason.INTERRUPTED
                else []
            ),
            state=self.state if result.get("state") is not None else None,
            custom=self.custom,
            artifacts=list(self.artifacts),
        )
        if finish is FinishReason.FAILED and error_wire is not None:
            failure = _error_from(error_wire, snapshot_id=result.get("snapshotId"))
            raise failed_turn(
                response,
                failure.message,
                status=failure.status,
                details=failure.details,
                snapshot_id=result.get("snapshotId"),
            )
        return response

    def _follow_snapshot(self, response: AgentResponse) -> None:
        self.session_id = response.session_id
        self.snapshot_id = response.snapshot_id
        self.messages = list(response.messages)
        self.custom, self.artifacts = response.custom, list(response.artifacts)


class _PatchedState:
    """The custom state a turn's ``customPatch`` chunks build, from the value before it."""

    def __init__(self, custom: Any) -> None:
        self.custom = custom
        self.changed = False

    def apply(self, chunk: Mapping[str, Any]) -> None:
        if "customPatch" in chunk:
            self.custom = apply_patch(self.custom, chunk["customPatch"])
            self.changed = True


def _state_messages(state: Mapping[str, Any] | None) -> list[Message]:
    if not state:
        return []
    return [Message.model_validate(m) for m in state.get("messages") or []]
