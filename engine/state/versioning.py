"""Definitions pinned per turn: an agent's definition as canonical JSON, its fingerprint,
the application version a turn is pinned to, the diff between two definitions, and the
migrations an app registers to move paused turns onto new definitions.

Every turn records the fingerprint of its agent's definition (model id, system prompt, tools
and interrupts with their schemas, ``max_turns``) and a description of it, and the
application version that created it: ``Engine(version=...)`` (``TURNSTILE_APP_VERSION`` when
the app passes its settings), else the agent's *tools version*, the fingerprint of its tools
and their schemas only (:func:`tools_version_of`), which a prompt edit leaves alone. Workers
claim only the versions they serve; resuming a turn paused under another definition is
refused (:class:`DefinitionChangedError`) unless a migration registered for its version maps
it onto the current one, or pinning is lenient and the tools and schemas are unchanged
(:mod:`engine.state.pinning`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from engine.conversation.parts import Message, Part
from engine.errors import DefinitionChangedError
from engine.tools import InterruptTool, Tool

__all__ = [
    "DefinitionChange",
    "DefinitionChangedError",
    "Migration",
    "MigrationFn",
    "PausedTurn",
    "Pinning",
    "describe_definition",
    "diff_definitions",
    "fingerprint_of",
    "format_changes",
    "interface_changes",
    "outline_definition",
    "tools_version_of",
]

#: Prefix of a fingerprint used as a version, so the two are told apart at a glance.
FINGERPRINT_PREFIX = "def-"
#: Prefix of a tools version (:func:`tools_version_of`), told apart from a fingerprint.
TOOLS_VERSION_PREFIX = "tools-"
#: Marks a description whose system prompt and tool elements are replaced by their digests.
OUTLINE_MARK = "outline"


def _tool_description(tool: Tool) -> dict[str, Any]:
    spec = tool.spec()
    described: dict[str, Any] = {
        "kind": "interrupt" if isinstance(tool, InterruptTool) else "tool",
        "description": tool.description,
        "inputSchema": spec.input_schema,
        "outputSchema": spec.output_schema,
    }
    return described


def describe_definition(
    *,
    agent: str,
    model: str,
    system: str | None,
    tools: Mapping[str, Tool],
    max_turns: int,
) -> dict[str, Any]:
    """The canonical JSON description of an agent's definition: what its fingerprint hashes
    and what a diff compares (tools keyed by name, so their order does not matter)."""
    return {
        "agent": agent,
        "model": model,
        "system": system,
        "maxTurns": max_turns,
        "tools": {name: _tool_description(tool) for name, tool in sorted(tools.items())},
    }


def _canonical(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal descriptions give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint_of(description: Mapping[str, Any]) -> str:
    """The stable hash of a definition's description (``def-`` and 16 hex digits of SHA-256
    of its canonical JSON): the same across processes, runs and dict orderings."""
    digest = hashlib.sha256(_canonical(description).encode("utf-8")).hexdigest()
    return FINGERPRINT_PREFIX + digest[:16]


def tools_version_of(description: Mapping[str, Any]) -> str:
    """The version an agent pins its turns to when the app declares none: ``tools-`` and 16
    hex digits of SHA-256 of the canonical JSON of the agent's name and, per tool, its kind
    and both schemas. Editing the prompt, the model, ``maxTurns`` or a tool's description
    keeps it, so workers of the edited app still claim the turns of the one before."""
    tools: Mapping[str, Mapping[str, Any]] = description.get("tools") or {}
    interface = {
        "agent": description.get("agent"),
        "tools": {
            name: {key: tool.get(key) for key in _INTERFACE_ELEMENTS}
            for name, tool in sorted(tools.items())
        },
    }
    digest = hashlib.sha256(_canonical(interface).encode("utf-8")).hexdigest()
    return TOOLS_VERSION_PREFIX + digest[:16]


class DefinitionChange(BaseModel):
    """One element that differs between two definitions: ``what`` is ``model``,
    ``system``, ``maxTurns`` or ``tools.<name>`` (with ``.inputSchema``, ``.outputSchema``,
    ``.kind`` or ``.description``); ``change`` is ``changed``, ``added`` or ``removed``."""

    what: str
    change: str
    before: Any = None
    after: Any = None

    def line(self) -> str:
        """One human-readable line naming the change."""
        if self.change == "changed" and self.what in ("model", "maxTurns"):
            return f"{self.what}: {self.before!r} -> {self.after!r}"
        return f"{self.what} {self.change}"


def diff_definitions(
    before: Mapping[str, Any] | None, after: Mapping[str, Any]
) -> list[DefinitionChange]:
    """What differs from ``before`` to ``after`` (two :func:`describe_definition` results);
    a turn recorded without a description (``None``) differs in everything it cannot show."""
    if before is None:
        return [DefinitionChange(what="definition", change="unknown", after=dict(after))]
    if before.get(OUTLINE_MARK) or after.get(OUTLINE_MARK):
        # An outline hides what it digests, so both sides are compared as outlines.
        before, after = outline_definition(before), outline_definition(after)
    changes: list[DefinitionChange] = []
    for key in ("model", "system", "maxTurns"):
        if before.get(key) != after.get(key):
            changes.append(
                DefinitionChange(
                    what=key, change="changed", before=before.get(key), after=after.get(key)
                )
            )
    old_tools: Mapping[str, Any] = before.get("tools") or {}
    new_tools: Mapping[str, Any] = after.get("tools") or {}
    for name in sorted(old_tools.keys() | new_tools.keys()):
        changes.extend(_tool_changes(name, old_tools.get(name), new_tools.get(name)))
    return changes


_TOOL_ELEMENTS = ("kind", "description", "inputSchema", "outputSchema")
#: What of a tool its callers depend on: a change to one of these is never resumed across
#: without a migration (a description is advice to the model, as the prompt is).
_INTERFACE_ELEMENTS = ("kind", "inputSchema", "outputSchema")


def interface_changes(changes: Sequence[DefinitionChange]) -> list[DefinitionChange]:
    """The ``changes`` that touch the tools or their schemas (a tool added or removed, a
    kind or a schema changed) or cannot be told (an unknown definition): what lenient
    pinning still refuses. The others (``system``, ``model``, ``maxTurns``, a tool's
    ``description``) only change what the model is told."""
    harmless = {"system", "model", "maxTurns"}
    return [
        change
        for change in changes
        if change.what not in harmless
        and not (
            change.change == "changed"
            and change.what.startswith("tools.")
            and change.what.endswith(".description")
        )
    ]


def _tool_changes(
    name: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> list[DefinitionChange]:
    what = f"tools.{name}"
    if before is None:
        return [DefinitionChange(what=what, change="added", after=after)]
    if after is None:
        return [DefinitionChange(what=what, change="removed", before=before)]
    return [
        DefinitionChange(
            what=f"{what}.{key}", change="changed", before=before.get(key), after=after.get(key)
        )
        for key in _TOOL_ELEMENTS
        if _canonical(before.get(key)) != _canonical(after.get(key))
    ]


def _digest(value: Any) -> str:
    """A short digest of ``value``'s canonical JSON: equal values, equal digests."""
    return "sha256:" + hashlib.sha256(_canonical(value).encode("utf-8")).hexdigest()[:16]


def outline_definition(description: Mapping[str, Any]) -> dict[str, Any]:
    """``description`` with the system prompt and every tool element replaced by a digest.

    A client-managed state blob carries this rather than the description, since the client
    holds the blob and must not read the system prompt or the tool schemas off it; diffing
    two outlines names the same changes as diffing the descriptions. Idempotent.
    """
    if description.get(OUTLINE_MARK):
        return dict(description)
    tools: Mapping[str, Mapping[str, Any]] = description.get("tools") or {}
    return {
        OUTLINE_MARK: True,
        "agent": description.get("agent"),
        "model": description.get("model"),
        "maxTurns": description.get("maxTurns"),
        "system": None if description.get("system") is None else _digest(description["system"]),
        "tools": {
            name: {key: _digest(tool.get(key)) for key in _TOOL_ELEMENTS}
            for name, tool in sorted(tools.items())
        },
    }


def format_changes(changes: Sequence[DefinitionChange]) -> str:
    """The changes as one ``; ``-separated line (for error messages and logs)."""
    return "; ".join(change.line() for change in changes) or "no differences"


class PausedTurn(BaseModel):
    """What a migration receives, and returns adjusted: the paused turn's conversation (its
    last message is the model message paused at interrupts) and the resume's answers."""

    snapshot_id: str
    from_version: str
    to_version: str
    messages: list[Message]
    respond: list[Part] = Field(default_factory=list)
    restart: list[Part] = Field(default_factory=list)
    #: What changed between the two definitions.
    changes: list[DefinitionChange] = Field(default_factory=list)


MigrationFn = Callable[[PausedTurn], "PausedTurn | Awaitable[PausedTurn]"]


@dataclass(frozen=True)
class Migration:
    """A registered migration: turns paused under ``from_version`` (an app version or a
    fingerprint) of ``agent`` (``None``: any agent) are mapped by ``fn``."""

    from_version: str
    fn: MigrationFn
    agent: str | None = None


@dataclass(frozen=True)
class Pinning:
    """What a new turn records of its definition: the app version that must run it, the
    definition's fingerprint and description, and — for a migrated resume — the version it
    was migrated from."""

    app_version: str
    fingerprint: str
    definition: Mapping[str, Any]
    migrated_from: str | None = None
