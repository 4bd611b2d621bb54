"""Pinning a new turn to a definition: which application version and definition it records,
and whether continuing its base across a definition change is allowed.

A resume or an expiry continues a paused turn. A resume whose paused turn was pinned to
another definition is refused (:class:`~engine.state.versioning.DefinitionChangedError`, listing
what changed) unless the engine registered a migration for the paused turn's version, which
adjusts the paused message and the answers; the resumed turn then records the current
version and a note naming the move. A resume under the same definition inherits the paused
turn's version; every other turn (a message, a retry, an expiry, a fork) records the
creating engine's version. A turn records only its definition's fingerprint; the diff
reads the paused turn's definition from the store by that fingerprint.
"""

from __future__ import annotations

import inspect
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
)
from engine.store import TurnInput, TurnRecord

__all__ = ["DefinitionSource", "PinnedTurn", "PinningAgent", "check_resumable", "pin_turn"]


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
    if migration is None:
        raise _refusal(agent, base, changes, client_managed=client_managed)
    return await _migrate(agent, migration, turn_input, base, conversation, current, changes)


async def check_resumable(
    agent: PinningAgent, paused: TurnRecord, definitions: DefinitionSource
) -> None:
    """Raise :class:`DefinitionChangedError` if ``agent`` could not resume ``paused`` (its
    definition changed and no migration covers it): the inbox checks before it records a
    decision that would enqueue such a resume."""
    if paused.definition_fingerprint in (None, agent.fingerprint) or paused.app_version is None:
        return
    if _find_migration(agent, paused) is None:
        raise _refusal(agent, paused, await _changes_since(agent, paused, definitions))


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
    return DefinitionChangedError(
        f"{paused} paused under version '{base.app_version}' of agent "
        f"'{agent.name}', whose definition has changed since (now version "
        f"'{agent.version}'): {format_changes(changes)}. Register a migration with "
        f"@engine.migrate(from_version='{base.app_version}'){move}.",
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
