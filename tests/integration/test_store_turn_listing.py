"""The store contract for turns by filter (``turnstile turns ls`` and the browser's runs
page), on every store (in memory, SQLite, PostgreSQL): owner, version, id prefix, status and
agent filters, and keyset pages that never repeat or skip a turn."""

from __future__ import annotations

from engine.status import TurnStatus
from engine.store import PAUSED, SessionStore, TurnQuery
from tests.integration.store_support import AGENT, claim, new_turn, paused_turn, settle


async def _listed(store: SessionStore, **filters: object) -> set[str]:
    return {row.id for row in await store.list_turns(TurnQuery.model_validate(filters))}


async def _some_turns(store: SessionStore) -> None:
    """ann owns s1 (two turns, the first failed) and s3 (paused, version v2); bob owns s2;
    s4 has no owner (a local caller)."""
    await store.create_turn(new_turn("ab-1", "s1", owner="ann", app_version="v1"))
    await settle(store, "ab-1", TurnStatus.FAILED)
    await store.create_turn(new_turn("ab-2", "s1", owner="ann", parent_id="ab-1", app_version="v1"))
    await store.create_turn(new_turn("b_1", "s2", owner="bob", app_version="v1"))
    await paused_turn(store, "ab%3", "s3", owner="ann", app_version="v2")
    await store.create_turn(new_turn("c-1", "s4", agent="clerk"))


async def test_a_requester_lists_only_the_turns_of_her_sessions(store: SessionStore) -> None:
    """``owner`` keeps the turns of sessions that principal owns; without it every turn is
    listed, each row naming its session's owner."""
    await _some_turns(store)
    assert await _listed(store, owner="ann") == {"ab-1", "ab-2", "ab%3"}
    assert await _listed(store, owner="bob") == {"b_1"}
    assert await _listed(store, owner="carol") == set()
    rows = await store.list_turns(TurnQuery())
    assert {row.id: row.owner for row in rows} == {
        "ab-1": "ann",
        "ab-2": "ann",
        "b_1": "bob",
        "ab%3": "ann",
        "c-1": None,
    }


async def test_the_filters_each_narrow_the_list(store: SessionStore) -> None:
    """Status (``paused`` too), agents, version and id prefix each keep only their turns; the
    prefix is matched literally and with case."""
    await _some_turns(store)
    assert await _listed(store, statuses=("failed",)) == {"ab-1"}
    assert await _listed(store, statuses=(PAUSED,)) == {"ab%3"}
    assert await _listed(store, statuses=("pending",), owner="ann") == {"ab-2"}
    assert await _listed(store, agents=("clerk",)) == {"c-1"}
    assert await _listed(store, agents=(AGENT,), app_version="v2") == {"ab%3"}
    assert await _listed(store, id_prefix="ab") == {"ab-1", "ab-2", "ab%3"}
    assert await _listed(store, id_prefix="ab%") == {"ab%3"}
    assert await _listed(store, id_prefix="b_") == {"b_1"}
    assert await _listed(store, id_prefix="a_") == set()
    assert await _listed(store, id_prefix="AB") == set()


async def test_a_listed_turn_says_what_it_waits_for_and_what_it_is(store: SessionStore) -> None:
    """A paused turn's row holds its open approvals; a message turn's row its text, its
    version and its place in the session."""
    await _some_turns(store)
    [paused] = await store.list_turns(TurnQuery(id_prefix="ab%3"))
    assert [(w.turn_id, w.ref) for w in paused.waiting] == [("ab%3", "r1")]
    assert (paused.status, paused.app_version) == (TurnStatus.COMPLETED, "v2")
    [second] = await store.list_turns(TurnQuery(id_prefix="ab-2"))
    assert (second.seq, second.parent_id, second.input_kind) == (2, "ab-1", "message")
    assert second.message_text == "message of ab-2"
    assert second.waiting == []


async def test_pages_follow_the_keyset_cursor_newest_first(store: SessionStore) -> None:
    """Pages of two, each after the last row of the one before, list every turn once, in the
    order of one whole read: newest first, ties by id."""
    for number in range(7):
        await store.create_turn(new_turn(f"t{number}", f"s{number}", owner="ann"))
        await claim(store, f"t{number}")
    whole = await store.list_turns(TurnQuery(owner="ann"))
    assert [row.key for row in whole] == sorted((row.key for row in whole), reverse=True)
    paged: list[str] = []
    before = None
    for _ in range(10):
        page = await store.list_turns(TurnQuery(owner="ann", before=before, limit=2))
        paged.extend(row.id for row in page)
        if len(page) < 2:
            break
        before = page[-1].key
    assert paged == [row.id for row in whole]
    assert len(paged) == 7


async def test_paused_turns_are_listed_once_each_and_only_while_paused(
    store: SessionStore,
) -> None:
    """The paused filter lists each turn waiting at approvals once, however many it waits for,
    and not a turn paused and since continued; with the other filters it narrows as they do,
    and its pages after the keyset cursor list each paused turn once, newest first."""
    await paused_turn(store, "p1", "s1", interrupted=("r1", "r2", "r3"), app_version="v1")
    await paused_turn(store, "p2", "s2", agent="clerk", app_version="v2")
    await paused_turn(store, "p3", "s3", interrupted=("r1", "r2"), app_version="v1")
    await paused_turn(store, "old", "s4")
    await store.create_turn(new_turn("new", "s4", parent_id="old"))
    await paused_turn(store, "p5", "s5", owner="ann", app_version="v2")

    whole = await store.list_turns(TurnQuery(statuses=(PAUSED,)))
    assert sorted(row.id for row in whole) == ["p1", "p2", "p3", "p5"]
    assert [row.key for row in whole] == sorted((row.key for row in whole), reverse=True)
    assert {row.id: len(row.waiting) for row in whole} == {"p1": 3, "p2": 1, "p3": 2, "p5": 1}
    assert await _listed(store, statuses=(PAUSED,), agent="clerk") == {"p2"}
    assert await _listed(store, statuses=(PAUSED,), app_version="v1") == {"p1", "p3"}
    assert await _listed(store, statuses=(PAUSED,), session_id="s4") == set()
    assert await _listed(store, statuses=(PAUSED,), owner="ann") == {"p5"}
    assert await _listed(store, statuses=(PAUSED,), id_prefix="p3") == {"p3"}
    assert await _listed(store, statuses=(PAUSED, "pending")) == {"p1", "p2", "p3", "p5", "new"}

    paged: list[str] = []
    before = None
    for _ in range(10):
        page = await store.list_turns(TurnQuery(statuses=(PAUSED,), before=before, limit=3))
        paged.extend(row.id for row in page)
        if len(page) < 3:
            break
        before = page[-1].key
    assert paged == [row.id for row in whole]
    since = whole[1].created_at
    assert await _listed(store, statuses=(PAUSED,), since=since) == {
        row.id for row in whole if row.created_at >= since
    }
