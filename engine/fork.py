"""Forking a turn: a new session whose first turn continues another turn's conversation from
one of its completed rounds (DBOS's fork, for turns: replaying, debugging, trying again from a
known point).

The new turn (input kind ``fork``) opens with a copy of the conversation as it stood after the
chosen round — the source's history, then its committed rounds up to that one — as its own
round 0, and the model is asked for the next round. Nothing of the source's journal comes
along: the copied rounds are history (their tools ran in the source turn and are not run
again), and every call of the fork runs under the fork's own idempotency keys. The source is
only read; it and its session are left as they are.

The fork's session state (custom state and artifacts) is the source's as of the chosen round:
the state the source started from (its parent's) with the recorded effects of the calls of
its rounds up to that one replayed; after the source's last committed round, simply its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.conversation.parts import Message, paused_calls
from engine.conversation.session_state import LiveState, SessionData
from engine.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from engine.store import (
    RoundRecord,
    SessionStore,
    ToolCallRecord,
    ToolCallStatus,
    TurnInput,
    TurnRecord,
)
from engine.turns.ownership import own_turn
from engine.turns.request import TurnRequest

if TYPE_CHECKING:
    from engine.agent import Agent
    from engine.response import AgentResponse

__all__ = ["ForkPoint", "continuable_rounds", "fork_point", "fork_turn"]


class ForkPoint:
    """Where a fork starts: the source turn, the round, and the conversation up to it."""

    def __init__(self, turn_id: str, round: int, conversation: Sequence[Message]) -> None:
        self.turn_id = turn_id
        self.round = round
        self.conversation = tuple(conversation)


def _continuable(round: RoundRecord) -> bool:
    """Whether the model can be asked what comes after ``round``: it ends with the user's or
    the tools' message, not with the model's answer or a pause at interrupts."""
    if not round.committed or not round.messages:
        return False
    last = round.messages[-1]
    return last.role != "model" and not paused_calls(last)


def continuable_rounds(rounds: Sequence[RoundRecord]) -> list[int]:
    """The committed rounds of a turn a fork may start after, in order."""
    return [r.round for r in sorted(rounds, key=lambda r: r.round) if _continuable(r)]


def fork_point(
    turn: TurnRecord,
    parent_conversation: Sequence[Message],
    rounds: Sequence[RoundRecord],
    round: int | None = None,
) -> ForkPoint:
    """The conversation of ``turn`` after ``round`` (default: its last round a fork can
    continue). Raises :class:`InvalidArgumentError` for a round the turn has not completed,
    :class:`FailedPreconditionError` for one that ended with the model's answer or a pause
    (the model has nothing to add after it) and when no round qualifies."""
    committed = {r.round: r for r in rounds if r.committed}
    allowed = continuable_rounds(rounds)
    if round is None:
        if not allowed:
            raise FailedPreconditionError(
                f"Turn {turn.id} has no completed round to fork from: each ends with the "
                "model's answer, or it has none yet.",
                snapshot_id=turn.id,
            )
        round = allowed[-1]
    elif round not in committed:
        done = ", ".join(str(n) for n in sorted(committed)) or "none"
        raise InvalidArgumentError(
            f"Turn {turn.id} has no completed round {round} (its completed rounds: {done}).",
            snapshot_id=turn.id,
        )
    elif round not in allowed:
        others = ", ".join(str(n) for n in allowed) or "none"
        raise FailedPreconditionError(
            f"Round {round} of turn {turn.id} ends with the model's answer or a pause at "
            f"interrupts, so there is nothing to continue; fork one of its rounds {others}.",
            snapshot_id=turn.id,
        )
    conversation = [m.copy_deep() for m in parent_conversation[: turn.history_length]]
    for number in sorted(committed):
        if number > round:
            break
        conversation.extend(m.copy_deep() for m in committed[number].messages)
    return ForkPoint(turn.id, round, conversation)


async def _state_at(
    store: SessionStore,
    source: TurnRecord,
    rounds: Sequence[RoundRecord],
    journal: Sequence[ToolCallRecord],
    point: ForkPoint,
) -> SessionData:
    """The source's session state after ``point.round``."""
    committed = [r.round for r in rounds if r.committed]
    if committed and point.round == max(committed):
        return SessionData.of(source.custom, source.artifacts)
    parent = await store.get_turn(source.parent_id) if source.parent_id else None
    state = LiveState(SessionData.of(parent.custom, parent.artifacts) if parent else SessionData())
    finished = (ToolCallStatus.DONE, ToolCallStatus.INTERRUPTED)
    replayed = sorted(
        (c for c in journal if c.round <= point.round and c.effects and c.status in finished),
        key=lambda c: (c.round, c.finished_at is None, c.finished_at, c.ref),
    )
    for call in replayed:
        state.replay(call.effects or [])
    return state.data()


async def fork_turn(
    agent: Agent,
    turn_id: str,
    *,
    round: int | None = None,
    owner: str | None = None,
    wait: bool = False,
    timeout: float | None = None,
) -> AgentResponse:
    """Start a new session of ``agent`` whose first turn continues turn ``turn_id`` after
    ``round`` (see :func:`fork_point`), and run it as any turn of the agent runs (queued for
    the workers, or here). With ``wait=False`` the response is the new ``pending`` snapshot.
    ``owner``: the principal that may see the source and owns the new session."""
    store = agent.store
    if store is None:
        raise FailedPreconditionError(
            f"Forking needs a session store; agent '{agent.name}' uses client-managed state."
        )
    source = await own_turn(store, turn_id, agent=agent.name, owner=owner)
    progress = await store.read_progress(turn_id)
    if progress is None:
        raise NotFoundError(f"Snapshot {turn_id} not found.")
    point = fork_point(source, progress.parent_conversation, progress.rounds, round)
    request = TurnRequest(
        input=TurnInput(kind="fork", forked_from=point.turn_id, fork_round=point.round),
        opening=point.conversation,
        owner=owner,
        opening_state=await _state_at(store, source, progress.rounds, progress.journal, point),
    )
    return await agent.run_turn(request, wait=wait, timeout=timeout)
