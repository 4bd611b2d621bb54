"""A session's custom state and artifacts, as Genkit's agents keep them.

Besides its messages, a session holds **custom state** (any JSON value, optionally checked
against a pydantic model the agent declares) and **artifacts** (named outputs such as a drafted
document; adding one whose name is taken replaces it). Tools read and change both through
their :class:`~engine.tools.ToolContext`.

Durability: the state as of a turn's last committed round is stored with the turn, written in
the same statement as that round. A tool call's changes are recorded on its journal row as
*effects* (JSON Patch operations, artifacts added), so a worker that continues an open round
after a crash replays the finished calls' effects onto the committed state instead of running
those calls again; a round that never commits leaves the committed state untouched.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from engine.conversation.parts import Part
from engine.conversation.schemas import Schema, SchemaSpec, SchemaViolation, to_jsonable
from engine.errors import InvalidArgumentError

__all__ = [
    "Artifact",
    "Effect",
    "LiveState",
    "RelayedPatches",
    "SessionData",
    "StateSchemaError",
    "apply_patch",
    "diff_patch",
    "merge_artifact",
]


class StateSchemaError(InvalidArgumentError):
    """Custom state that does not match the agent's ``state_schema`` (``INVALID_ARGUMENT``)."""


class Artifact(BaseModel):
    """Genkit's ``Artifact``: ``{name?, parts, metadata?}``."""

    name: str | None = None
    parts: list[Part] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The artifact as Genkit's JSON."""
        wire: dict[str, Any] = {"parts": [p.to_wire() for p in self.parts]}
        if self.name is not None:
            wire["name"] = self.name
        if self.metadata is not None:
            wire["metadata"] = self.metadata
        return wire

    @classmethod
    def coerce(cls, value: Artifact | Mapping[str, Any]) -> Artifact:
        """An artifact from itself or its JSON; a malformed one is ``INVALID_ARGUMENT``."""
        if isinstance(value, Artifact):
            return value.model_copy(deep=True)
        try:
            return cls.model_validate(dict(value))
        except ValueError as exc:
            raise InvalidArgumentError(f"Malformed artifact: {exc}") from exc


class SessionData(BaseModel):
    """The custom state and artifacts a session holds after some committed round."""

    custom: Any = None
    artifacts: list[Artifact] = Field(default_factory=list)

    def artifacts_wire(self) -> list[dict[str, Any]]:
        """The artifacts as Genkit's JSON."""
        return [a.to_wire() for a in self.artifacts]

    @classmethod
    def of(cls, custom: Any, artifacts: Sequence[Any] | None) -> SessionData:
        """From stored (or client-sent) JSON; a malformed artifact is ``INVALID_ARGUMENT``."""
        return cls(custom=custom, artifacts=[Artifact.coerce(a) for a in artifacts or []])


def merge_artifact(artifacts: list[Artifact], artifact: Artifact) -> None:
    """Add ``artifact``, replacing the one of the same name if there is one (Genkit's rule)."""
    if artifact.name is not None:
        for index, existing in enumerate(artifacts):
            if existing.name == artifact.name:
                artifacts[index] = artifact
                return
    artifacts.append(artifact)


# -- RFC 6902 ------------------------------------------------------------------------------


def _pointer(path: Sequence[str]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise InvalidArgumentError(f"Malformed JSON pointer '{pointer}'.")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def diff_patch(old: Any, new: Any, path: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """RFC 6902 operations turning ``old`` into ``new``: objects are compared member by
    member, anything else (arrays included) is replaced whole where it differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict[str, Any]] = []
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": _pointer((*path, key))})
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "add", "path": _pointer((*path, key)), "value": value})
            else:
                ops.extend(diff_patch(old[key], value, (*path, key)))
        return ops
    if old == new and type(old) is type(new):
        return []
    return [{"op": "replace", "path": _pointer(path), "value": copy.deepcopy(new)}]


def _parent(doc: Any, tokens: list[str]) -> tuple[Any, str]:
    target = doc
    for token in tokens[:-1]:
        target = target[int(token)] if isinstance(target, list) else target[token]
    return target, tokens[-1]


def _apply_one(doc: Any, op: Mapping[str, Any]) -> Any:
    kind, tokens = op.get("op"), _tokens(str(op.get("path", "")))
    if kind in ("add", "replace") and not tokens:
        return copy.deepcopy(op.get("value"))
    if kind == "remove" and not tokens:
        return None
    if kind not in ("add", "replace", "remove"):
        raise InvalidArgumentError(f"Unsupported JSON Patch operation '{kind}'.")
    parent, last = _parent(doc, tokens)
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if kind == "add":
            parent.insert(index, copy.deepcopy(op.get("value")))
        elif kind == "replace":
            parent[index] = copy.deepcopy(op.get("value"))
        else:
            del parent[index]
    elif kind == "remove":
        del parent[last]
    else:
        parent[last] = copy.deepcopy(op.get("value"))
    return doc


def apply_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """``doc`` (deep-copied) with the ``add`` / ``replace`` / ``remove`` operations applied."""
    result = copy.deepcopy(doc)
    try:
        for op in ops:
            result = _apply_one(result, op)
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise InvalidArgumentError(f"JSON Patch does not apply: {exc}") from exc
    return result


# -- the state of a running turn -----------------------------------------------------------

#: One effect a tool call had: ``{"customPatch": [ops]}`` or ``{"artifact": {...}}``.
Effect = dict[str, Any]
#: Where the live state reports each change as a stream chunk's wire form.
ChangeSink = Callable[[dict[str, Any]], None]


class LiveState:
    """The custom state and artifacts of one running turn, shared by its concurrent tools.

    Tools may run in threads of their own, so changes take a lock. Each change is applied at
    once, appended to the calling tool's effects, queued as a stream chunk (taken by
    :meth:`take_chunks`) and marks the state changed since its last commit."""

    def __init__(self, data: SessionData, schema: SchemaSpec = None) -> None:
        self._custom = copy.deepcopy(data.custom)
        self._artifacts = [a.model_copy(deep=True) for a in data.artifacts]
        self._schema = Schema(schema) if schema is not None else None
        # Re-entrant: an update function may read the state through the context.
        self._lock = threading.RLock()
        self._chunks: list[dict[str, Any]] = []
        #: What the stream last told the client the custom state is (``None``: nothing yet
        #: this turn, so the next patch replaces the whole value).
        self._sent: tuple[Any] | None = None
        self.changed = False

    @property
    def custom(self) -> Any:
        """A copy of the custom state as it is now."""
        with self._lock:
            return copy.deepcopy(self._custom)

    @property
    def artifacts(self) -> list[Artifact]:
        """Copies of the artifacts as they are now."""
        with self._lock:
            return [a.model_copy(deep=True) for a in self._artifacts]

    def data(self) -> SessionData:
        """The state as it is now."""
        with self._lock:
            return SessionData(
                custom=copy.deepcopy(self._custom),
                artifacts=[a.model_copy(deep=True) for a in self._artifacts],
            )

    def checked(self, value: Any) -> Any:
        """``value`` as JSON, validated against the agent's state schema when it has one."""
        if self._schema is None:
            return to_jsonable(value)
        try:
            return self._schema.dump(self._schema.parse(to_jsonable(value)))
        except SchemaViolation as exc:
            raise StateSchemaError(
                f"Custom state does not match the agent's state schema: {exc}"
            ) from exc

    def update_custom(self, change: Any, effects: list[Effect]) -> Any:
        """Set the custom state to ``change`` (or to ``change(current)`` when callable);
        returns the new value. A value breaking the state schema raises
        :class:`StateSchemaError` and changes nothing."""
        # The whole read-modify-write holds the lock: two tools in threads of their own
        # updating at once must not both start from the same value and lose one change.
        with self._lock:
            current = copy.deepcopy(self._custom)
            value = self.checked(change(current) if callable(change) else change)
            ops = diff_patch(self._custom, value)
            if not ops:
                return copy.deepcopy(value)
            self._custom = value
            effects.append({"customPatch": ops})
            self.changed = True
            self._queue_patch()
            return copy.deepcopy(value)

    def _queue_patch(self) -> None:
        if self._sent is None:
            patch = [{"op": "replace", "path": "", "value": copy.deepcopy(self._custom)}]
        else:
            patch = diff_patch(self._sent[0], self._custom)
        self._sent = (copy.deepcopy(self._custom),)
        self._chunks.append({"customPatch": patch})

    def add_artifact(self, artifact: Artifact | Mapping[str, Any], effects: list[Effect]) -> None:
        """Add ``artifact``, replacing the one of the same name."""
        added = Artifact.coerce(artifact)
        with self._lock:
            merge_artifact(self._artifacts, added)
            effects.append({"artifact": added.model_dump(mode="json", exclude_none=True)})
            self.changed = True
            self._chunks.append({"artifact": added.to_wire()})

    def replay(self, effects: Sequence[Effect]) -> None:
        """Apply effects a finished call recorded (recovery); nothing is streamed."""
        with self._lock:
            for effect in effects:
                if "customPatch" in effect:
                    self._custom = apply_patch(self._custom, effect["customPatch"])
                elif "artifact" in effect:
                    merge_artifact(self._artifacts, Artifact.coerce(effect["artifact"]))
                self.changed = True

    def take_chunks(self) -> list[dict[str, Any]]:
        """The stream chunks of the changes made since the last call, in order."""
        with self._lock:
            taken, self._chunks = self._chunks, []
        return taken

    def take_changed(self) -> SessionData | None:
        """The state if it changed since the last call (a committed round then carries it)."""
        with self._lock:
            if not self.changed:
                return None
            self.changed = False
        return self.data()


class RelayedPatches:
    """Keeps a relayed stream's ``customPatch`` chunks consistent for the client.

    A relayed chunk can be lost (too large for a notification, a dropped connection), and a
    client applying later patches to a value that missed one goes wrong. This follows the
    value the forwarded patches build from the turn's starting state: a patch that does not
    apply to it is held back, and so is every later one; at the end, :meth:`rebase` gives the
    whole-value replace that brings the client to the settled state, when it differs."""

    def __init__(self, start: Any) -> None:
        self._value = copy.deepcopy(start)
        self._broken = False

    def admit(self, chunk: Mapping[str, Any]) -> bool:
        """Whether to forward ``chunk`` (anything but a patch that no longer applies)."""
        if "customPatch" not in chunk:
            return True
        if self._broken:
            return False
        try:
            self._value = apply_patch(self._value, chunk["customPatch"])
        except InvalidArgumentError:
            self._broken = True
            return False
        return True

    def rebase(self, settled: Any) -> dict[str, Any] | None:
        """The ``customPatch`` chunk replacing the whole value with ``settled``, if the
        forwarded patches did not lead there; ``None`` when they did."""
        if not self._broken and self._value == settled:
            return None
        return {"customPatch": [{"op": "replace", "path": "", "value": copy.deepcopy(settled)}]}
