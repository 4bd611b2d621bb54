"""Who may see a turn: the agent that ran it and, behind authentication, the session's owner.

One place for the check so that every read and continuation reports another agent's or
another principal's turn the same way: as unknown, never as forbidden.
"""

from __future__ import annotations

from engine.errors import NotFoundError
from engine.store import SessionStore, TurnRecord

__all__ = ["check_own", "own_turn", "owned_by", "visible"]


async def owned_by(store: SessionStore, session_id: str, owner: str | None) -> bool:
    """Whether ``owner`` may see the session (``None``: a trusted local caller)."""
    if owner is None:
        return True
    session = await store.get_session(session_id)
    return session is not None and session.owner == owner


async def visible(
    store: SessionStore, turn: TurnRecord | None, *, agent: str, owner: str | None
) -> bool:
    """Whether ``turn`` exists, is ``agent``'s, and ``owner`` may see its session."""
    return (
        turn is not None and turn.agent == agent and await owned_by(store, turn.session_id, owner)
    )


async def check_own(
    store: SessionStore,
    snapshot_id: str,
    turn: TurnRecord | None,
    *,
    agent: str,
    owner: str | None,
) -> TurnRecord:
    """``turn`` if it is ``agent``'s and ``owner`` may see it; else "not found"."""
    if turn is None or not await visible(store, turn, agent=agent, owner=owner):
        raise NotFoundError(f"Snapshot '{snapshot_id}' not found for agent '{agent}'.")
    return turn


async def own_turn(
    store: SessionStore, snapshot_id: str, *, agent: str, owner: str | None
) -> TurnRecord:
    """The turn ``snapshot_id``, read and checked as :func:`check_own` does."""
    turn = await store.get_turn(snapshot_id)
    return await check_own(store, snapshot_id, turn, agent=agent, owner=owner)
