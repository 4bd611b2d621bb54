"""The SessionStore contract on pinned definitions: a turn keeps its application version and
fingerprint, the definition is kept once per fingerprint and read by it, claims filter on the
versions a worker serves, and a turn's first event keeps the note its creator gave (a
migration's).

The contract tests run on each store of
:data:`~tests.integration.store_support.STORE_FACTORIES` (the ``store`` fixture); the
operator's move between versions (``SqlSessionStore.move_version``) runs on SQLite and
PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from engine.status import TurnStatus
from engine.store import SessionStore, TurnEvent
from engine.store.memory import InMemorySessionStore
from engine.store.memory import list_events as memory_events
from stores.schema import agent_definitions
from stores.sql import SqlSessionStore
from stores.turn_versions import VersionMove
from stores.turns import list_events as sql_events
from tests.databases import sql_store
from tests.integration.store_support import AGENT, answer, new_turn, paused_turn

DEFINITION: dict[str, Any] = {
    "agent": AGENT,
    "model": "scripted",
    "system": None,
    "maxTurns": 5,
    "tools": {},
}


async def _events(store: SessionStore, turn_id: str) -> list[TurnEvent]:
    if isinstance(store, InMemorySessionStore):
        return memory_events(store, turn_id)
    assert isinstance(store, SqlSessionStore)
    return await store._read(lambda c: sql_events(c, turn_id))


async def test_the_version_fingerprint_and_definition_are_kept(store: SessionStore) -> None:
    """create_turn stores the version and fingerprint on the turn (get_turn and the claim
    return them) and the definition under its fingerprint (read_definition returns it)."""
    created = await store.create_turn(
        new_turn("t1", app_version="v1", definition_fingerprint="def-1", definition=DEFINITION)
    )
    assert (created.app_version, created.definition_fingerprint) == ("v1", "def-1")
    assert await store.get_turn("t1") == created
    (claimed,) = await store.claim_next(owner="w", lease_seconds=30, versions=["v1"])
    assert (claimed.turn.id, claimed.turn.app_version, claimed.turn.definition_fingerprint) == (
        "t1",
        "v1",
        "def-1",
    )
    assert await store.read_definition("def-1") == DEFINITION
    assert await store.read_definition("def-unknown") is None


async def test_a_definition_is_kept_once_per_fingerprint(store: SessionStore) -> None:
    """Many turns pinned to one fingerprint keep one definition row: the first written
    stays, even when a later turn — also one created through another store on the same
    database, which has not seen the fingerprint — brings another description."""
    await store.create_turn(
        new_turn("t1", "s1", definition_fingerprint="def-1", definition=DEFINITION)
    )
    other = {**DEFINITION, "model": "another"}
    await store.create_turn(new_turn("t2", "s2", definition_fingerprint="def-1", definition=other))
    assert await store.read_definition("def-1") == DEFINITION
    if isinstance(store, SqlSessionStore):
        second = SqlSessionStore(store.url)
        try:
            await second.create_turn(
                new_turn("t3", "s3", definition_fingerprint="def-1", definition=other)
            )
        finally:
            await second.close()
        assert await store.read_definition("def-1") == DEFINITION
        count = await store._read(
            lambda c: c.execute(sa.select(sa.func.count()).select_from(agent_definitions))
        )
        assert count.scalar_one() == 1


async def test_a_worker_claims_only_the_versions_it_serves(store: SessionStore) -> None:
    """A v2 worker leaves v1's turn alone and takes v2's; unpinned turns go to anyone."""
    await store.create_turn(new_turn("old", "s1", app_version="v1"))
    await store.create_turn(new_turn("new", "s2", app_version="v2"))
    await store.create_turn(new_turn("legacy", "s3"))
    claimed = await store.claim_next(owner="w2", lease_seconds=30, limit=10, versions=["v2"])
    assert sorted(t.turn.id for t in claimed) == ["legacy", "new"]
    assert await store.claim_next(owner="w2", lease_seconds=30, versions=["v2"]) == []
    (old,) = await store.claim_next(owner="w1", lease_seconds=30, versions=["v1"])
    assert old.turn.id == "old"


async def test_the_creation_note_is_the_first_events_note(store: SessionStore) -> None:
    """A migrated resume's note lands on its pending event (the timeline shows the move)."""
    await paused_turn(store, "t1", app_version="v1")
    await store.create_turn(
        new_turn(
            "t2",
            kind="resume",
            parent_id="t1",
            history_length=1,
            app_version="v2",
            note="migrated from version v1 to v2",
        ),
        answers=[answer("t1", "r1")],
    )
    (first, *_) = await _events(store, "t2")
    assert (first.to_status, first.note) == (TurnStatus.PENDING, "migrated from version v1 to v2")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_an_operator_moves_paused_and_queued_turns_to_another_version(
    backend: str,
) -> None:
    """move_version re-pins a version's paused and queued turns — not its leased ones, nor
    another version's — records the move on each, and finds nothing left a second time."""
    async with sql_store(backend) as store:
        assert isinstance(store, SqlSessionStore)
        await paused_turn(store, "paused", "s1", app_version="v1")
        await store.create_turn(new_turn("queued", "s2", app_version="v1"))
        await store.create_turn(new_turn("running", "s3", app_version="v1"))
        await store.create_turn(new_turn("other", "s4", app_version="v9"))
        await store.claim_next(owner="w", lease_seconds=30, among=["running"])
        waiting = await store.list_version_waiting("v1")
        assert sorted(t.id for t in waiting) == ["paused", "queued"]
        move = VersionMove(to_version="v2", fingerprint="def-2", definition=DEFINITION)
        moved = await store.move_version(
            waiting, from_version="v1", moves={AGENT: move}, note="moved from v1 to v2"
        )
        assert sorted(moved) == ["paused", "queued"]
        assert await store.read_definition("def-2") == DEFINITION
        for turn_id in moved:
            turn = await store.get_turn(turn_id)
            assert turn is not None
            assert (turn.app_version, turn.definition_fingerprint) == ("v2", "def-2")
            assert (await _events(store, turn_id))[-1].note == "moved from v1 to v2"
        paused = await store.get_turn("paused")
        assert paused is not None and paused.status is TurnStatus.COMPLETED
        for turn_id, version in (("other", "v9"), ("running", "v1")):
            kept = await store.get_turn(turn_id)
            assert kept is not None and kept.app_version == version
        assert await store.list_version_waiting("v1") == []
        again = await store.move_version(
            waiting, from_version="v1", moves={AGENT: move}, note="again"
        )
        assert again == []
