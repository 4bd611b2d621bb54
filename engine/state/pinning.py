"""Pinning a new turn to a definition: which application version and definition it records,
and whether continuing its base across a definition change is allowed.

A resume or an expiry continues a paused turn. A resume whose paused turn was pinned to
another definition is refused (:class:`~engine.state.versioning.DefinitionChangedError`, listing
what changed) unless the engine registered a migration for the paused turn's version, which
adjusts the paused message and the answers; the resumed turn then records the current
version and a note naming the move. Pinning is *lenient* when the app declares no version,
or sets ``Engine(lenient_pinning=True)`` (``turnstile worker/serve --dev``): then a resume
across changes that keep every tool and schema (the prompt, the model, ``maxTurns``, a
tool's description) goes on under the current definition, with a warning and a note naming
the changes. A resume under the same definition inherits the paused turn's version; every
other turn (a message, a retry, an expiry, a fork) records the creating engine's version. A
turn records only its definition's fingerprint; the diff reads the paused turn's definition
from the store by that fingerprint.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.conversation.parts import Message
from engine.conversation.schemas import to_jsonable
from engine.errors import DefinitionChangedError, FailedPreconditionError
from engine.state.versioning import (
    DefinitionChange,
    Migration,
    PausedTurn,
    Pinning,
    diff_definitions,
    format_changes,
    interface_changes,
)
from engine.store import TurnInput, TurnRecord

__all__ = [
    "DefinitionSource",
    "PinnedTurn",
    "PinningAgent",
    "check_resumable",
    "is_lenient",
    "pin_turn",
]

logger = logging.getLogger("turnstile.pinning")


class PinningAgent(Protocol):
    """What pinning reads from the agent."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def definition(self) -> dict[str, Any]: ...

    @property
    def migrations(self) -> Sequence[Migration]: ...

    @property
    def declared_version(self) -> str | None: ...

    @property
    def lenient_pinning(self) -> bool: ...


class DefinitionSource(Protocol):
    """Where a paused turn's definition is read from by its fingerprint (the store)."""

    async def read_definition(self, fingerprint: str) -> dict[str, Any] | None: ...


async def _changes_since(
    agent: PinningAgent, base: TurnRecord, definitions: DefinitionSource
) -> list[DefinitionChange]:
    """What differs between the definition ``base`` was pinned to and ``agent``'s."""
    assert base.definition_fingerprint is not None
    before = await definitions.read_definition(base.definition_fingerprint)
    return diff_definitions(before, agent.definition)


@dataclass(frozen=True)
class PinnedTurn:
    """What the new turn records, and the input and conversation it is validated against
    (a migration's output, or the request's own)."""

    pinning: Pinning
    input: TurnInput
    conversation: list[Message]
    note: str | None = None


def is_lenient(agent: PinningAgent) -> bool:
    """Whether ``agent`` resumes across definition changes that keep its tools and schemas:
    when its app declares no version (nothing says which deploy a turn belongs to), or when
    the engine was made lenient (``--dev``). A declared version without it stays strict."""
    return agent.declared_version is None or agent.lenient_pinning


def _leniency(agent: PinningAgent) -> str:
    """Why pinning is lenient for ``agent``, for the warning."""
    if agent.declared_version is None:
        return "the app declares no version"
    return "lenient pinning (--dev)"


def _find_migration(agent: PinningAgent, base: TurnRecord) -> Migration | None:
    """The migration registered for the base's version or fingerprint (one for this agent
    wins over one for any agent)."""
    keys = {base.app_version, base.definition_fingerprint} - {None}
    found = [
        m for m in agent.migrations if m.from_version in keys and m.agent in (None, agent.name)
    ]
    found.sort(key=lambda m: m.agent is None)
    return found[0] if found else None


def _current(agent: PinningAgent) -> Pinning:
    return Pinning(
        app_version=agent.version, fingerprint=agent.fingerprint, definition=agent.definition
    )


async def pin_turn(
    agent: PinningAgent,
    turn_input: TurnInput,
    base: TurnRecord | None,
    conversation: list[Message],
    definitions: DefinitionSource,
    *,
    client_managed: bool = False,
) -> PinnedTurn:
    """What a new turn continuing ``base`` (``None``: a new session) with ``turn_input``
    is pinned to; raises :class:`DefinitionChangedError` for a resume across a definition
    change that no migration covers (before anything is written). ``definitions`` gives
    the base's definition for the diff, read only when the definition changed.
    ``client_managed``: ``base`` was rebuilt from a signed blob, which only a migration can
    move."""
    current = _current(agent)
    if (
        turn_input.kind != "resume"
        or base is None
        or base.definition_fingerprint is None
        or base.app_version is None
    ):
        return PinnedTurn(current, turn_input, conversation)
    if base.definition_fingerprint == agent.fingerprint:
        inherited = Pinning(
            app_version=base.app_version,
            fingerprint=agent.fingerprint,
            definition=agent.definition,
        )
        return PinnedTurn(inherited, turn_input, conversation)
    changes = await _changes_since(agent, base, definitions)
    migration = _find_migration(agent, base)
    if migration is not None:
        return await _migrate(agent, migration, turn_input, base, conversation, current, changes)
    if is_lenient(agent) and not interface_changes(changes):
        return _resume_leniently(agent, turn_input, base, conversation, current, changes)
    raise _refusal(agent, base, changes, client_managed=client_managed)


def _resume_leniently(
    agent: PinningAgent,
    turn_input: TurnInput,
    base: TurnRecord,
    conversation: list[Message],
    current: Pinning,
    changes: Sequence[DefinitionChange],
) -> PinnedTurn:
    """The resume goes on under the current definition, pinned to the current version so
    the current workers run it; logged as a warning and noted on the turn's timeline."""
    described = format_changes(list(changes))
    logger.warning(
        "resuming %s of agent %s paused under another definition (%s, now %s): %s; "
        "allowed because %s",
        base.id,
        agent.name,
        base.definition_fingerprint,
        agent.fingerprint,
        described,
        _leniency(agent),
        extra={
            "paused_turn_id": base.id,
            "agent": agent.name,
            "from_version": base.app_version,
            "to_version": agent.version,
            "changes": [change.what for change in changes],
        },
    )
    note = (
        f"resumed under a changed definition (from version {base.app_version} to "
        f"{agent.version}; {_leniency(agent)}): {described}"
    )
    return PinnedTurn(current, turn_input, conversation, note=note)


async def check_resumable(
    agent: PinningAgent, paused: TurnRecord, definitions: DefinitionSource
) -> None:
    """Raise :class:`DefinitionChangedError` if ``agent`` could not resume ``paused`` (its
    definition changed, no migration covers it, and pinning is strict or the tools or their
    schemas changed): the inbox checks before it records a decision that would enqueue
    such a resume."""
    if paused.definition_fingerprint in (None, agent.fingerprint) or paused.app_version is None:
        return
    if _find_migration(agent, paused) is not None:
        return
    changes = await _changes_since(agent, paused, definitions)
    if is_lenient(agent) and not interface_changes(changes):
        return
    raise _refusal(agent, paused, changes)


def _refusal(
    agent: PinningAgent,
    base: TurnRecord,
    changes: Sequence[DefinitionChange],
    *,
    client_managed: bool = False,
) -> DefinitionChangedError:
    """The error naming what changed since ``base`` paused, and the ways forward (a
    client's blob is in no database the CLI could move)."""
    paused = "The client-managed state" if client_managed else f"Snapshot {base.id}"
    move = (
        ""
        if client_managed
        else f", or move the turn with `turnstile turns migrate --from {base.app_version} "
        f"--to {agent.version}`"
    )
    lenient_would = (
        ""
        if interface_changes(changes)
        else " Only what the model is told changed: an engine with lenient_pinning=True "
        "(turnstile worker/serve --dev) resumes it with a warning."
    )
    return DefinitionChangedError(
        f"{paused} paused under version '{base.app_version}' of agent "
        f"'{agent.name}', whose definition has changed since (now version "
        f"'{agent.version}'): {format_changes(changes)}. Register a migration with "
        f"@engine.migrate(from_version='{base.app_version}'){move}.{lenient_would}",
        details={
            "fromVersion": base.app_version,
            "toVersion": agent.version,
            "changes": [c.model_dump(mode="json") for c in changes],
        },
        # A client-managed base has no snapshot a client could name.
        snapshot_id=None if client_managed else base.id,
    )


async def _migrate(
    agent: PinningAgent,
    migration: Migration,
    turn_input: TurnInput,
    base: TurnRecord,
    conversation: list[Message],
    current: Pinning,
    changes: Sequence[DefinitionChange],
) -> PinnedTurn:
    """Run ``migration`` on the paused state and check what it returned."""
    assert base.app_version is not None
    paused = PausedTurn(
        snapshot_id=base.id,
        from_version=base.app_version,
        to_version=agent.version,
        messages=[m.model_copy(deep=True) for m in conversation],
        respond=[p.model_copy(deep=True) for p in turn_input.respond],
        restart=[p.model_copy(deep=True) for p in turn_input.restart],
        changes=list(changes),
    )
    result = migration.fn(paused)
    migrated = await result if inspect.isawaitable(result) else result
    if not isinstance(migrated, PausedTurn):
        raise TypeError(f"The migration from '{migration.from_version}' must return a PausedTurn.")
    _check_history_kept(conversation, migrated.messages, base.id)
    adjusted = turn_input.model_copy(
        update={
            "respond": migrated.respond,
            "restart": migrated.restart,
            "paused": migrated.messages[-1],
            "migrated_from": base.app_version,
        }
    )
    pinning = Pinning(
        app_version=current.app_version,
        fingerprint=current.fingerprint,
        definition=current.definition,
        migrated_from=base.app_version,
    )
    note = (
        f"migrated from version {base.app_version} to {agent.version} by a registered "
        f"migration: {format_changes(list(changes))}"
    )
    return PinnedTurn(pinning, adjusted, migrated.messages, note=note)


def _check_history_kept(before: list[Message], after: list[Message], snapshot_id: str) -> None:
    """A migration adjusts the paused message only: the history before it is the record of
    what happened and stays as it was."""

    def dumped(messages: Sequence[Message]) -> list[Mapping[str, Any]]:
        return [to_jsonable(m.model_dump(mode="json", by_alias=True)) for m in messages]

    if not after or len(after) != len(before) or dumped(after[:-1]) != dumped(before[:-1]):
        raise FailedPreconditionError(
            f"The migration for snapshot {snapshot_id} changed the conversation before the "
            "paused message; a migration may adjust only the paused (last) message and the "
            "resume's answers.",
            snapshot_id=snapshot_id,
        )
