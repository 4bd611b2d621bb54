"""Genkit's HTTP wire format: request bodies, stream frames and error responses.

Bodies are read with a size limit, parsed as JSON and validated here, before anything runs:
a malformed request is a typed :class:`~engine.errors.InvalidArgumentError` naming the
problem (HTTP 400), never a 500 and never a half-started turn. See ``docs/http.md``.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, StrictBool, StrictStr, ValidationError
from pydantic_core import PydanticCustomError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from engine.conversation.parts import Message, Part
from engine.errors import AgentError, InvalidArgumentError, StoreError
from engine.remote.logsafe import escaped

M = TypeVar("M", bound=BaseModel)

logger = logging.getLogger("turnstile.http")

__all__ = [
    "DATABASE_UNAVAILABLE",
    "DEFAULT_CHALLENGE",
    "IDEMPOTENCY_HEADER",
    "ID_RULE",
    "MAX_ID_LENGTH",
    "MAX_JSON_DEPTH",
    "AbortBody",
    "BodyTooLargeError",
    "SnapshotBody",
    "TurnBody",
    "UnsupportedMediaTypeError",
    "check_id",
    "check_storable",
    "check_text",
    "client_error",
    "error_response",
    "frame",
    "http_status",
    "id_problem",
    "parse_body",
    "read_json",
    "to_message",
    "to_parts",
    "wants_stream",
    "wire_error",
]

#: Genkit status → HTTP code (Genkit's ``httpStatusCode`` plus the codes it leaves out).
HTTP_STATUS: dict[str, int] = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ABORTED": 409,
    "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}


class BodyTooLargeError(InvalidArgumentError):
    """The request body is over the server's limit (HTTP 413)."""

    default_status = "RESOURCE_EXHAUSTED"


class UnsupportedMediaTypeError(InvalidArgumentError):
    """The request body is not declared ``application/json`` (HTTP 415)."""


def http_status(error: AgentError) -> int:
    """The HTTP code for ``error`` (500 for statuses that mean a server fault)."""
    if isinstance(error, BodyTooLargeError):
        return 413
    if isinstance(error, UnsupportedMediaTypeError):
        return 415
    return HTTP_STATUS.get(error.status, 500)


#: What a client is told of a failed database call.
DATABASE_UNAVAILABLE = "The database is unavailable; try again shortly."


def client_error(error: AgentError) -> AgentError:
    """``error`` as a client may see it: a database failure loses the driver's words, which
    name the database's host, port and name (they go to the server's log instead)."""
    if type(error) is not StoreError:
        return error
    logger.warning("database error answered as %s: %s", error.status, escaped(error.message))
    return StoreError(
        DATABASE_UNAVAILABLE,
        may_have_applied=error.may_have_applied,
        status=error.status,
        snapshot_id=error.snapshot_id,
    )


def wire_error(error: AgentError) -> dict[str, Any]:
    """``{"status", "message", "details"}``; ``details.type`` names the error class when the
    error carries no details of its own, so a Python client can raise the same typed error
    (Genkit clients just show it). A database failure is told as :func:`client_error` does."""
    error = client_error(error)
    wire = error.to_wire()
    if error.details is None:
        wire["details"] = {"type": type(error).__name__}
    return wire


def error_response(error: AgentError) -> JSONResponse:
    """Genkit's non-streaming error body: ``{"status", "message", "details"?}``; a 401 says
    how to authenticate (``WWW-Authenticate``, the error's ``challenge``, else bearer), and
    an error with a ``retry_after`` (seconds) says when to come back (``Retry-After``)."""
    code = http_status(error)
    headers: dict[str, str] = {}
    if code == 401:
        headers["www-authenticate"] = getattr(error, "challenge", None) or DEFAULT_CHALLENGE
    retry_after = getattr(error, "retry_after", None)
    if isinstance(retry_after, int):
        headers["retry-after"] = str(retry_after)
    return JSONResponse(wire_error(error), status_code=code, headers=headers)


#: The ``WWW-Authenticate`` challenge of a 401 whose error names none (RFC 6750).
DEFAULT_CHALLENGE = 'Bearer realm="turnstile"'


def frame(payload: dict[str, Any], *, field: str = "data") -> bytes:
    """One stream frame: ``data: <compact JSON>\\n\\n`` (or ``error: ...`` for errors).

    ASCII-only JSON: the genuine client decodes each network read separately, so a multi-byte
    character split across two reads would be corrupted; ``\\uXXXX`` escapes cannot split.
    """
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=True)
    return f"{field}: {body}\n\n".encode("ascii")


def wants_stream(request: Request) -> bool:
    """Streaming as Genkit's express handler decides it: ``Accept`` or ``?stream=true``."""
    accept = request.headers.get("accept", "")
    return "text/event-stream" in accept or request.query_params.get("stream") == "true"


async def read_json(request: Request, *, max_bytes: int) -> Any:
    """The request body as JSON, refusing bodies over ``max_bytes`` without reading them all.

    Only a body declared ``application/json`` is read: a browser sends ``text/plain``,
    form and body-less posts cross-site without a CORS preflight, so a hostile page could
    otherwise drive a server on the user's machine or network.
    """
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        shown = repr(media_type) if media_type else "none"
        raise UnsupportedMediaTypeError(
            f"Content-Type {shown} is not accepted; send the body as application/json."
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLargeError(f"Request body is {declared} bytes; the limit is {max_bytes}.")
    received = bytearray()
    try:
        async for piece in request.stream():
            received.extend(piece)
            if len(received) > max_bytes:
                raise BodyTooLargeError(f"Request body is over the limit of {max_bytes} bytes.")
    except ClientDisconnect as exc:
        raise InvalidArgumentError("The client went away before sending the whole body.") from exc
    if not received:
        raise InvalidArgumentError("Request body is empty; expected a JSON object.")
    try:
        value = json.loads(received, parse_constant=_no_constant)
    except RecursionError:
        raise InvalidArgumentError(_TOO_DEEP) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, NaN, a 5000-digit number
        raise InvalidArgumentError(f"Request body is not valid JSON: {exc}.") from exc
    check_storable(value)
    return value


#: Deeper bodies are refused: the engine walks values recursively (schemas, to_jsonable), and
#: a body nested to the interpreter's limit would fail there with a 500 instead of here.
MAX_JSON_DEPTH = 64
_TOO_DEEP = f"Request body is not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels."


def _no_constant(name: str) -> Any:
    # json accepts NaN and Infinity; JSON (and PostgreSQL's jsonb) does not.
    raise ValueError(f"{name} is not a JSON value")


def check_text(text: str, where: str = "Request body") -> None:
    """Refuse a string PostgreSQL cannot store (so it is a 400, not a failed insert: a 500)."""
    if "\x00" in text:
        raise InvalidArgumentError(
            f"{where} holds a NUL character (\\u0000), which cannot be stored."
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            f"{where} holds a lone surrogate character (an unpaired \\ud800-\\udfff "
            "escape), which is not valid Unicode."
        ) from None


#: The longest id a client may send: session, snapshot and turn ids, refs, inbox filters (the
#: server's own ids are 36-character UUIDs; a longer key would also overflow PostgreSQL's index).
MAX_ID_LENGTH = 200
#: The request header carrying a turn request's idempotency key (the same id rule applies).
IDEMPOTENCY_HEADER = "idempotency-key"
ID_RULE = (
    f"ids are 1 to {MAX_ID_LENGTH} printable characters, without control or other "
    "non-printable characters"
)


def id_problem(value: str) -> str | None:
    """What makes ``value`` unfit to be an id (``None``: it is fit), as a predicate."""
    if not value:
        return "is empty"
    if len(value) > MAX_ID_LENGTH:
        return f"is too long ({len(value)} characters)"
    # False for control, format, line/paragraph separator, surrogate and unassigned characters
    # (so an id cannot break a log line or smuggle a terminal escape), true for the space.
    if not value.isprintable():
        return "holds a control or other non-printable character"
    return None


def check_id(value: str, where: str) -> str:
    """``value`` if it is fit to be an id; else an :class:`InvalidArgumentError` naming it."""
    problem = id_problem(value)
    if problem is not None:
        raise InvalidArgumentError(f"{where} {problem}; {ID_RULE}.")
    return value


def _wire_id(value: str) -> str:
    problem = id_problem(value)
    if problem is not None:
        # A custom error keeps pydantic's field location but not its "Value error, " prefix.
        raise PydanticCustomError(
            "invalid_id", "the id {problem}; {rule}", {"problem": problem, "rule": ID_RULE}
        )
    return value


#: An id field of a request body (refused with a 400 naming the field when unfit).
WireId = Annotated[StrictStr, AfterValidator(_wire_id)]


def check_storable(value: Any) -> None:
    """Every string of a decoded body (keys too) storable, and the nesting bounded.

    Iterative, so a deep value cannot exhaust the stack while being checked.
    """
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidArgumentError(_TOO_DEEP)
        if isinstance(item, str):
            check_text(item)
        elif isinstance(item, dict):
            for key, child in item.items():
                check_text(key)
                pending.append((child, depth + 1))
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)


def _describe(error: ValidationError) -> str:
    problems = []
    for issue in error.errors()[:5]:
        where = ".".join(str(p) for p in issue["loc"]) or "(root)"
        problems.append(f"{where}: {issue['msg']}")
    more = len(error.errors()) - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


def parse_body(model: type[M], raw: Any) -> M:
    """Validate a decoded body; a violation is an :class:`InvalidArgumentError` naming it."""
    if not isinstance(raw, dict):
        raise InvalidArgumentError(f"Request body must be a JSON object, not {type(raw).__name__}.")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise InvalidArgumentError(f"Request body is invalid: {_describe(exc)}.") from exc


class _Open(BaseModel):
    # Genkit's schemas allow additional properties; so do we, and ignore them.
    model_config = ConfigDict(extra="ignore")


class WireResume(_Open):
    respond: list[dict[str, Any]] | None = None
    restart: list[dict[str, Any]] | None = None


class WireAgentInput(_Open):
    message: dict[str, Any] | None = None
    resume: WireResume | None = None
    detach: StrictBool | None = None


class WireAgentInit(_Open):
    snapshotId: WireId | None = None  # Genkit's field names
    sessionId: WireId | None = None
    state: dict[str, Any] | None = None


class TurnBody(_Open):
    """``{"data": AgentInput, "init": AgentInit}`` of a turn (``init`` may be left out)."""

    data: WireAgentInput
    init: WireAgentInit = WireAgentInit()


class SnapshotSelector(_Open):
    snapshotId: WireId | None = None
    sessionId: WireId | None = None


class SnapshotBody(_Open):
    """``{"data": {"snapshotId"} | {"sessionId"}}`` of ``getSnapshot``."""

    data: SnapshotSelector


class AbortSelector(_Open):
    snapshotId: WireId


class AbortBody(_Open):
    """``{"data": {"snapshotId"}}`` of ``abort``."""

    data: AbortSelector


def to_message(raw: dict[str, Any]) -> Message:
    """A user message from its wire form."""
    if "content" not in raw:
        # Genkit's MessageSchema requires content; an empty default would run a blank turn.
        raise InvalidArgumentError("data.message is not a valid message: content: Field required.")
    try:
        message = Message.model_validate(raw)
    except ValidationError as exc:
        raise InvalidArgumentError(
            f"data.message is not a valid message: {_describe(exc)}."
        ) from exc
    if message.role != "user":
        raise InvalidArgumentError(f"data.message must have role 'user', not '{message.role}'.")
    return message


def to_parts(raw: list[dict[str, Any]] | None, where: str) -> list[Part]:
    """Parts from their wire form (``where`` names the field in errors)."""
    parts: list[Part] = []
    for position, item in enumerate(raw or []):
        try:
            parts.append(Part.model_validate(item))
        except ValidationError as exc:
            raise InvalidArgumentError(
                f"{where}[{position}] is not a valid part: {_describe(exc)}."
            ) from exc
    return parts
