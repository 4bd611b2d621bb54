"""The HTTP server: an engine's agents over Genkit's flow protocol, plus the approval inbox.

Per agent, three routes, exactly as the genuine ``genkit/beta/client`` calls them:

* ``POST /api/<agent>`` — a turn. Streams ``data: {"message": chunk}`` frames then one
  ``data: {"result": output}`` frame (or one ``error: {"error": ...}`` frame) when the request
  accepts ``text/event-stream`` or says ``?stream=true``; otherwise ``{"result": output}``.
* ``POST /api/<agent>/getSnapshot`` — ``{"data": {"snapshotId"} | {"sessionId"}}``.
* ``POST /api/<agent>/abort`` — ``{"data": {"snapshotId"}}``.

Failures follow Genkit: a request that cannot be read (auth, size, JSON, schema, an unfit
id, unknown agent) is a 4xx JSON error before any frame; misuse Genkit throws on (``init`` that
does not fit the agent, a snapshot of another session, a detach with no turn to detach) is an
error frame; a turn that is refused (bad resume, busy session, unknown snapshot) or fails is a
*result* with ``finishReason: "failed"`` and ``error``. Nothing is written for a refused
request. A client of a non-streaming or detached request that goes away does not stop its
turn: it settles and persists (``abort`` stops a turn); a streaming client that disconnects
before its turn settles aborts it. Client text reaches the log only escaped
(:mod:`engine.remote.logsafe`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Lifespan, Receive, Scope, Send
from starlette.types import Message as ASGIMessage

from engine.agent import Agent, TurnRequest
from engine.engine import Engine
from engine.errors import (
    AgentError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    NoWorkerError,
    TurnFailedError,
)
from engine.remote.admission import Reservation, TurnAdmission
from engine.remote.auth import Authenticator, InboxPolicy, OwnerInboxPolicy, Principal
from engine.remote.cursors import CursorSeal
from engine.remote.hosts import LOCAL_HOSTS, AllowedHosts
from engine.remote.inbox_routes import InboxRoutes
from engine.remote.logsafe import escaped, escaped_traceback
from engine.remote.redirects import relative_slash_redirects
from engine.remote.shutdown import until_shutdown
from engine.remote.ui import InboxUI, UiSettings
from engine.remote.wire import (
    IDEMPOTENCY_HEADER,
    AbortBody,
    SnapshotBody,
    TurnBody,
    check_id,
    error_response,
    frame,
    parse_body,
    read_json,
    to_message,
    to_parts,
    wants_stream,
    wire_error,
)
from engine.response import AgentChunk, AgentResponse
from engine.status import FinishReason, TurnStatus
from engine.store import SessionStore, TurnInput, TurnRecord

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_app"]

logger = logging.getLogger("turnstile.http")

#: Bodies over this many bytes are refused with 413 (``max_body_bytes=`` changes it).
DEFAULT_MAX_BODY_BYTES = 1_000_000


class _Misuse(AgentError):
    """A request Genkit throws on rather than answering with a result: ``init`` that does not
    fit the agent or its session, or an input with no turn to run (an error frame)."""

    default_status = "FAILED_PRECONDITION"


def create_app(
    engine: Engine,
    *,
    auth: Authenticator | None = None,
    inbox_policy: InboxPolicy | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    lifespan: Lifespan[Starlette] | None = None,
    routes: Sequence[BaseRoute] = (),
    middleware: Sequence[Middleware] = (),
    max_turns_per_principal: int | None = None,
    ui: bool = True,
    ui_settings: UiSettings | None = None,
    allowed_hosts: Sequence[str] | None = None,
    worker_wait: float | None = None,
) -> Starlette:
    """An ASGI app serving ``engine``'s agents (run it with uvicorn or ``turnstile serve``).

    ``auth`` authenticates every request (``None``: an open server, for local use only);
    sessions then belong to the principal that created them. ``inbox_policy`` decides which
    approvals a principal sees and decides (default: those of its own sessions). ``routes``
    are served as well, without authentication (``turnstile serve`` adds its health probes
    and metrics); ``middleware`` wraps every route, outermost first.
    ``max_turns_per_principal`` refuses a turn request with 429 while its principal (every
    unauthenticated caller together counting as one) has that many turns in flight
    (:mod:`engine.remote.admission`; ``None``: no limit). Redirects (a path with a trailing
    slash too many or too few) are relative: the request's ``Host`` never comes back.
    ``ui`` serves the approval inbox's web pages at ``/ui`` (:mod:`engine.remote.ui`,
    ``docs/inbox.md``), with browser sessions signed per ``ui_settings``.
    ``allowed_hosts``: the ``Host`` names it answers to (``*``, ``*.example.com``); by
    default any with an authenticator, and only the local names
    (:data:`~engine.remote.hosts.LOCAL_HOSTS`) without one, so a page that rebinds its name
    to this machine cannot drive an open server (:mod:`engine.remote.hosts`). The ``routes``
    given (probes, metrics) answer any ``Host``. ``worker_wait``: seconds a turn request
    waits for a worker to claim its queued turn before it is answered 503 ``UNAVAILABLE``
    (:class:`~engine.errors.NoWorkerError`; the turn stays queued); ``None``: for ever.
    """
    admission = (
        TurnAdmission(engine, max_turns_per_principal)
        if max_turns_per_principal is not None
        else None
    )
    server = _Server(engine, auth, max_body_bytes, admission, worker_wait)
    ui_settings = ui_settings or UiSettings()
    # One seal for the JSON inbox and the pages, so either's cursors work on the other.
    cursors = CursorSeal(ui_settings.secret)
    inbox = InboxRoutes(
        engine, server.authenticate, inbox_policy or OwnerInboxPolicy(), max_body_bytes, cursors
    )
    served: list[BaseRoute] = [
        *routes,
        Route("/api/{agent}", server.turn, methods=["POST"]),
        Route("/api/{agent}/getSnapshot", server.get_snapshot, methods=["POST"]),
        Route("/api/{agent}/abort", server.abort, methods=["POST"]),
        *inbox.routes(),
    ]
    if ui:
        policy = inbox_policy or OwnerInboxPolicy()
        pages = InboxUI(
            engine,
            auth=auth,
            policy=policy,
            max_body_bytes=max_body_bytes,
            settings=ui_settings,
            cursors=cursors,
        )
        served.extend(pages.routes())
    hosts = allowed_hosts if allowed_hosts is not None else (LOCAL_HOSTS if auth is None else ["*"])
    exempt = [route.path for route in routes if isinstance(route, Route)]
    app = Starlette(
        routes=served,
        lifespan=lifespan,
        middleware=[
            *middleware,
            Middleware(AllowedHosts, hosts=hosts, exempt=exempt),
            Middleware(_EscapedErrors),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    relative_slash_redirects(app)
    app.state.turnstile = server
    return app


#: Starlette's own refusals (no such route, wrong method) in Genkit's status vocabulary.
_ROUTING_STATUS = {404: "NOT_FOUND", 405: "INVALID_ARGUMENT"}


async def _http_error(request: Request, exc: Exception) -> Response:
    """Routing errors as the JSON ``{status, message}`` every other error is (not plain text)."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}."
    elif exc.status_code == 404:
        message = f"No route serves {request.url.path}."
    else:
        message = str(exc.detail)
    status = _ROUTING_STATUS.get(exc.status_code, "INVALID_ARGUMENT")
    return JSONResponse(
        {"status": status, "message": message}, status_code=exc.status_code, headers=exc.headers
    )


def _internal_error_response() -> Response:
    return JSONResponse({"status": "INTERNAL", "message": "Internal error."}, status_code=500)


async def _internal_error(_request: Request, exc: Exception) -> Response:
    """A bug outside the routes (in middleware) is still a 500, but a JSON one."""
    return _internal_error_response()


class _EscapedErrors:
    """A route's unexpected exception becomes a JSON 500, logged here with its messages
    escaped: Starlette would re-raise it for the ASGI server to log raw, and its message can
    quote client text (a plugin echoing a header, a database error quoting a key)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: ASGIMessage) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as error:
            logger.error(
                "%s %s failed\n%s",
                scope.get("method"),
                escaped(scope.get("path")),
                escaped_traceback(error),
            )
            # Once the head is sent the status cannot change: the connection just ends.
            if not started:
                await _internal_error_response()(scope, receive, tracked)


class _Server:
    def __init__(
        self,
        engine: Engine,
        auth: Authenticator | None,
        max_body_bytes: int,
        admission: TurnAdmission | None = None,
        worker_wait: float | None = None,
    ) -> None:
        self.engine = engine
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self.admission = admission
        #: Seconds a request waits for a worker to claim its queued turn (``None``: forever).
        self.worker_wait = worker_wait
        # Turns outlive the request that started them (a client may disconnect, a detached
        # turn runs on): keep a reference so they are not garbage-collected mid-run.
        self._background: set[asyncio.Task[Any]] = set()

    # -- request plumbing ----------------------------------------------------------------

    async def authenticate(self, request: Request) -> Principal | None:
        return None if self.auth is None else await self.auth(request)

    def _agent(self, request: Request) -> Agent:
        name = request.path_params["agent"]
        agent = self.engine.agents.get(name)
        if agent is None:
            raise NotFoundError(f"Agent '{name}' not found.")
        return agent

    async def _handle(
        self, request: Request, body_model: type[Any]
    ) -> tuple[Agent, Any, Principal | None]:
        principal = await self.authenticate(request)
        agent = self._agent(request)
        body = parse_body(body_model, await read_json(request, max_bytes=self.max_body_bytes))
        return agent, body, principal

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- getSnapshot and abort -------------------------------------------------------------

    async def get_snapshot(self, request: Request) -> Response:
        try:
            agent, body, principal = await self._handle(request, SnapshotBody)
            selector = body.data
            if (selector.snapshotId is None) == (selector.sessionId is None):
                got = "neither" if selector.snapshotId is None else "both"
                raise InvalidArgumentError(
                    f"getSnapshot requires exactly one of 'snapshotId' or 'sessionId' (got {got})."
                )
            if agent.store is None:
                raise FailedPreconditionError(
                    _NO_STORE.format(what="getSnapshot", agent=agent.name)
                )
            snapshot = await agent.get_snapshot(
                snapshot_id=selector.snapshotId,
                session_id=selector.sessionId,
                owner=_owner(principal),
            )
            if snapshot is None:
                which = (
                    f"Snapshot '{selector.snapshotId}'"
                    if selector.snapshotId is not None
                    else f"Session '{selector.sessionId}'"
                )
                raise NotFoundError(f"{which} not found for agent '{agent.name}'.")
        except AgentError as error:
            return error_response(error)
        return JSONResponse({"result": snapshot.to_wire()})

    async def abort(self, request: Request) -> Response:
        try:
            agent, body, principal = await self._handle(request, AbortBody)
            if agent.store is None:
                raise FailedPreconditionError(_NO_STORE.format(what="abort", agent=agent.name))
            snapshot_id = body.data.snapshotId
            try:
                outcome = await agent.request_abort(snapshot_id, owner=_owner(principal))
            except NotFoundError:
                # Genkit's answer for a snapshot it does not hold: no status, not an error.
                return JSONResponse({"result": {"snapshotId": snapshot_id}})
        except AgentError as error:
            return error_response(error)
        # Genkit's `status` is the one before the abort; ours adds the one it left.
        result = {
            "snapshotId": snapshot_id,
            "status": outcome.previous.value,
            "resultingStatus": outcome.status.value,
        }
        return JSONResponse({"result": result})

    # -- turns ---------------------------------------------------------------------------

    async def turn(self, request: Request) -> Response:
        """A turn request; an admitted one keeps its place among its principal's turns in
        flight until its response has been sent (or abandoned by the client)."""
        reservation = Reservation()
        try:
            response = await self._turn(request, reservation)
        except BaseException:
            reservation.release()
            raise
        return reservation.released_after(response)

    async def _turn(self, request: Request, reservation: Reservation) -> Response:
        try:
            agent, body, principal = await self._handle(request, TurnBody)
            turn_request, detach = _turn_request(agent, body, principal)
            if isinstance(turn_request, TurnRequest):
                key = request.headers.get(IDEMPOTENCY_HEADER)
                if key is not None:
                    key = check_id(key, "The Idempotency-Key header")
                    turn_request = replace(turn_request, idempotency_key=key)
                turn_request = await self._foreign_snapshot(agent, turn_request) or turn_request
            if self.admission is not None and isinstance(turn_request, TurnRequest):
                turn_request = await self.admission.admit(agent, turn_request, reservation)
        except AgentError as error:
            return error_response(error)
        stream = wants_stream(request)
        events = self._turn_events(agent, turn_request, detach, body.init.state, stream)
        if stream:
            return StreamingResponse(_frames(events), media_type="text/plain")
        async for kind, payload in events:
            if kind == "result":
                return JSONResponse({"result": payload})
            if kind == "error":
                assert isinstance(payload, AgentError)
                return error_response(payload)
        raise AssertionError("a turn always ends with a result or an error")  # pragma: no cover

    async def _turn_events(
        self,
        agent: Agent,
        turn_request: TurnRequest | _Misuse,
        detach: bool,
        echo_state: Any,
        stream: bool,
    ) -> AsyncIterator[tuple[str, Any]]:
        """``("message", chunk)``... then ``("result", output)`` or ``("error", AgentError)``.

        Chunks only when ``stream``: a queued turn nobody streams publishes none. A streamed
        turn whose client goes away before it settles is aborted (see _abort_abandoned)."""
        if isinstance(turn_request, _Misuse):
            yield "error", turn_request
            return
        if detach:
            yield await self._detached(agent, turn_request)
            return
        chunks: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def sink(chunk: AgentChunk) -> None:
            chunks.put_nowait(chunk.to_wire())

        started: asyncio.Future[tuple[SessionStore, TurnRecord]] = (
            asyncio.get_running_loop().create_future()
        )

        def on_started(store: SessionStore, turn: TurnRecord) -> None:
            if not started.done():
                started.set_result((store, turn))

        task = asyncio.create_task(
            agent.run_turn(
                turn_request,
                on_chunk=sink if stream else None,
                on_started=on_started,
                worker_wait=self.worker_wait,
            )
        )
        self._keep(task)
        task.add_done_callback(_log_unexpected)
        stopping = asyncio.ensure_future(_server_stopping(agent, started))
        try:
            async for chunk in _chunks_until_done(chunks, task, stopping):
                yield "message", chunk
        finally:
            # Only a streaming response is cancelled when its client disconnects (a turn
            # whose wait the stopping server ends stays queued: it is answered, not abandoned).
            if stream and not task.done() and not stopping.done():
                self._keep(asyncio.create_task(_abort_abandoned(agent, started, task)))
            if not stopping.done():
                stopping.cancel()
        if stopping.done() and not stopping.cancelled() and not task.done():
            task.cancel()  # only this request's wait: the queued turn is in the store
            yield "error", stopping.result()
            return
        while not chunks.empty():
            yield "message", chunks.get_nowait()
        for event in _settled_events(agent, task, echo_state):
            yield event

    async def _foreign_snapshot(self, agent: Agent, request: TurnRequest) -> _Misuse | None:
        """The misuse of naming a snapshot with the id of another session (Genkit throws it:
        an error frame); ``None`` when the ids agree or the snapshot is not the caller's to
        see, which the turn then refuses as "not found" without revealing anything."""
        if agent.store is None or request.snapshot_id is None or request.session_id is None:
            return None
        turn = await agent.store.get_turn(request.snapshot_id)
        if turn is None or turn.agent != agent.name or turn.session_id == request.session_id:
            return None
        if request.owner is not None:
            session = await agent.store.get_session(turn.session_id)
            if session is None or session.owner != request.owner:
                return None
        return _Misuse(
            f"Snapshot {turn.id} does not belong to session {request.session_id} "
            f"(it belongs to {turn.session_id}).",
            status="INVALID_ARGUMENT",
        )

    async def _detached(self, agent: Agent, turn_request: TurnRequest) -> tuple[str, Any]:
        """Start the turn and answer at once with its pending snapshot (queued for the
        workers, or running on in this process for an inline agent)."""
        try:
            response = await agent.run_turn(turn_request, wait=False)
        except AgentError as refused:
            return "result", _refused(refused, agent, None)
        return "result", _detached_output(response.session_id, response.snapshot_id)


_NO_STORE = (
    "{what} requires a persistent store; agent '{agent}' uses client-managed state (no store)."
)


def _owner(principal: Principal | None) -> str | None:
    return principal.id if principal is not None else None


def _turn_request(
    agent: Agent, body: TurnBody, principal: Principal | None
) -> tuple[TurnRequest | _Misuse, bool]:
    """The engine request for a turn body (parts/message errors raise: HTTP 400)."""
    data, init = body.data, body.init
    if data.resume is not None:
        turn_input = TurnInput(
            kind="resume",
            message=to_message(data.message) if data.message is not None else None,
            respond=to_parts(data.resume.respond, "data.resume.respond"),
            restart=to_parts(data.resume.restart, "data.resume.restart"),
        )
    elif data.message is not None:
        turn_input = TurnInput(kind="message", message=to_message(data.message))
    else:
        turn_input = TurnInput(kind="retry")
    detach = bool(data.detach)
    if agent.store is None and (init.snapshotId or init.sessionId):
        which = "snapshotId" if init.snapshotId else "sessionId"
        return _Misuse(
            f"Cannot use '{which}' with agent '{agent.name}': this agent has no store configured "
            "(client-managed state). Send 'state' instead."
        ), detach
    if agent.store is not None and init.state is not None:
        return _Misuse(
            f"Cannot send 'state' to agent '{agent.name}': this agent uses a server-managed "
            "store. Send 'snapshotId' or 'sessionId' instead."
        ), detach
    if detach and agent.store is None:
        return _Misuse(
            f"Cannot detach a turn of agent '{agent.name}': detached turns need a store "
            "(client-managed state has nowhere to keep a running turn)."
        ), detach
    if detach and data.message is None and data.resume is None:
        # Genkit's detach-only input starts no turn (it detaches one already running, and an
        # HTTP request carries no other): refused, rather than run as a retry.
        return _Misuse(
            "data.detach needs a turn to detach: send it with data.message or data.resume "
            "(a detach-only input starts no turn).",
            status="INVALID_ARGUMENT",
        ), detach
    return (
        TurnRequest(
            input=turn_input,
            session_id=init.sessionId,
            snapshot_id=init.snapshotId,
            state=init.state,
            owner=_owner(principal),
            decided_by=_owner(principal),
        ),
        detach,
    )


def _refused(error: AgentError, agent: Agent, echo_state: Any) -> dict[str, Any]:
    """Genkit's graceful failure for a turn that never started."""
    output: dict[str, Any] = {"finishReason": FinishReason.FAILED.value, "error": wire_error(error)}
    if error.snapshot_id is not None and agent.store is not None:
        output["snapshotId"] = error.snapshot_id
    if agent.store is None and echo_state is not None:
        output["state"] = echo_state
    return output


def _detached_output(session_id: str, snapshot_id: str | None) -> dict[str, Any]:
    output: dict[str, Any] = {"sessionId": session_id, "finishReason": FinishReason.DETACHED.value}
    if snapshot_id is not None:
        output["snapshotId"] = snapshot_id
    return output


def _closing_chunks(response: AgentResponse) -> list[dict[str, Any]]:
    """What Genkit streams after the model's chunks: the paused requests once more (an
    index-less tool chunk) when the turn is interrupted, then ``turnEnd``."""
    closing: list[dict[str, Any]] = []
    if response.finish_reason is FinishReason.INTERRUPTED and response.message is not None:
        requests = [p.to_wire() for p in response.message.content if p.tool_request is not None]
        closing.append({"modelChunk": {"role": "tool", "content": requests}})
    end: dict[str, Any] = {}
    if response.state is None and response.snapshot_id is not None:
        end["snapshotId"] = response.snapshot_id
    if response.finish_reason is not None:
        end["finishReason"] = response.finish_reason.value
    elif response.status is TurnStatus.FAILED:
        end["finishReason"] = FinishReason.FAILED.value
    closing.append({"turnEnd": end})
    return closing


async def _frames(events: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[bytes]:
    """Stream frames; always exactly one final ``result`` or ``error`` frame (the genuine
    client spins forever on a stream that ends without one)."""
    try:
        async for kind, payload in events:
            if kind == "message":
                yield frame({"message": payload})
            elif kind == "result":
                yield frame({"result": payload})
                return
            else:
                assert isinstance(payload, AgentError)
                # Bare {status, message}: the genuine client prints details as "[object Object]".
                yield frame({"error": payload.to_wire()}, field="error")
                return
    except AgentError as error:
        yield frame({"error": error.to_wire()}, field="error")
    except Exception as error:
        logger.error("turn stream failed\n%s", escaped_traceback(error))
        yield frame({"error": {"status": "INTERNAL", "message": "Internal error."}}, field="error")


async def _chunks_until_done(
    chunks: asyncio.Queue[dict[str, Any]], task: asyncio.Task[Any], stop: asyncio.Future[Any]
) -> AsyncIterator[dict[str, Any]]:
    """The chunks queued while ``task`` runs, until it ends or ``stop`` resolves (the ones
    left then are the caller's)."""
    while not task.done() and not stop.done():
        getter = asyncio.ensure_future(chunks.get())
        try:
            # The turn is not cancelled with this wait (asyncio.wait shields it).
            await asyncio.wait({getter, task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            yield getter.result()


def _settled_events(
    agent: Agent, task: asyncio.Task[AgentResponse], echo_state: Any
) -> list[tuple[str, Any]]:
    """The closing events of a request whose turn task ended: its closing chunks and result,
    a graceful failed result for a request refused before its turn existed, or an error."""
    try:
        response = task.result()
    except NoWorkerError as unclaimed:
        # Not a refusal: the turn exists and stays queued, so the caller gets the 503.
        return [("error", unclaimed)]
    except TurnFailedError as failure:
        settled = failure.response if isinstance(failure.response, AgentResponse) else None
        if settled is None:  # pragma: no cover - run_turn always attaches the response
            return [("error", failure)]
        response = settled
    except AgentError as refused:
        # Refused before a turn existed (bad resume, busy, unknown snapshot): a graceful
        # failed result, as Genkit answers; the chat keeps its snapshot and can retry.
        return [("result", _refused(refused, agent, echo_state))]
    except Exception:
        return [("error", AgentError("Internal error; see the server log.", status="INTERNAL"))]
    return [
        *(("message", extra) for extra in _closing_chunks(response)),
        ("result", response.to_wire()),
    ]


async def _server_stopping(
    agent: Agent, started: asyncio.Future[tuple[SessionStore, TurnRecord]]
) -> AgentError:
    """The error ending the wait of a request whose turn is queued for the workers once the
    server is stopping. Never returns while the turn runs in this process (the shutdown
    waits for it), nor while the server goes on."""
    if not agent.queued:
        await asyncio.Future()
    _, turn = await started
    await until_shutdown()
    return AgentError(
        f"The server is stopping. Turn {turn.id} is not failed: it goes on in the workers "
        "(fetch it with getSnapshot, or abort it).",
        status="UNAVAILABLE",
        snapshot_id=turn.id,
        details={"snapshotId": turn.id},
    )


async def _abort_abandoned(
    agent: Agent,
    started: asyncio.Future[tuple[SessionStore, TurnRecord]],
    task: asyncio.Task[Any],
) -> None:
    """Abort the turn of a streaming request whose client disconnected, so it does not hold
    a worker slot for nobody (``docs/decisions.md``, "A streamed turn ends with its
    connection"); once it exists, if the client left while it was being created."""
    await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
    if not started.done() or task.done():
        return
    store, turn = started.result()
    try:
        outcome = await agent.abort_in(store, turn.id)
    except Exception as error:  # the turn still settles on its own; nothing else to do
        logger.warning("turn %s: abort after disconnect failed: %s", turn.id, escaped(error))
        return
    logger.info(
        "turn %s: its streaming client disconnected; abort requested (%s)",
        turn.id,
        outcome.status.value,
    )


def _log_unexpected(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None and not isinstance(error, AgentError):
        logger.error("turn task failed\n%s", escaped_traceback(error))
