"""What a turn's runner writes, and when: each write fenced by its lease, two of them deferred.

Two pieces of progress run nothing, so a crash before they are written loses nothing that
recovery cannot rebuild, and they ride on a later write instead of costing one of their own:

* the usage of a model call whose round is written later (a round that is one interrupt is
  written with the settling transition, see ``TurnRunner._only_pauses``);
* a closed round that ran nothing — a resume answered only by ``respond`` — which the turn's
  next write carries (:meth:`RoundWriter.save` as ``earlier``, or :meth:`RoundWriter.flush`
  before any other write or the settle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.conversation.parts import Message
from engine.conversation.session_state import SessionData
from engine.model import ModelUsage
from engine.store import RoundRecord, SessionStore, ToolCallRecord

__all__ = ["RoundWriter"]


class RoundWriter:
    """The lease holder's writes of one turn's rounds and journal rows."""

    def __init__(
        self,
        store: SessionStore,
        turn_id: str,
        lease_token: int,
        changed_state: Callable[[], SessionData | None] = lambda: None,
    ) -> None:
        self.store = store
        self.turn_id = turn_id
        self.lease_token = lease_token
        #: The session state if it changed since the last committed round (which then
        #: carries it, so the state is written with the round that made it).
        self._changed_state = changed_state
        #: Usage of a model call whose round is written later.
        self.unsaved_usage: ModelUsage | None = None
        #: A closed round that ran nothing, with its journal rows, not written yet.
        self._unwritten: tuple[RoundRecord, list[ToolCallRecord]] | None = None

    def take_usage(self, usage: ModelUsage | None) -> ModelUsage | None:
        """``usage``, or the usage of a model call whose round was not written yet."""
        unsaved, self.unsaved_usage = self.unsaved_usage, None
        return usage if unsaved is None else unsaved

    def defer(self, closed: RoundRecord, rows: Sequence[ToolCallRecord]) -> None:
        """Leave ``closed`` (and its journal rows) to the turn's next write."""
        self._unwritten = (closed, list(rows))

    async def save(
        self,
        number: int,
        messages: list[Message],
        *,
        committed: bool,
        calls: Sequence[ToolCallRecord] | None = None,
        usage: ModelUsage | None = None,
    ) -> None:
        """Write round ``number`` (and a deferred round before it, in the same write)."""
        earlier, earlier_calls = self._unwritten or (None, [])
        await self.store.save_round(
            self.turn_id,
            lease_token=self.lease_token,
            round=RoundRecord(
                round=number,
                messages=messages,
                committed=committed,
                state=self._changed_state() if committed else None,
            ),
            calls=[*earlier_calls, *(calls or [])],
            usage=self.take_usage(usage),
            earlier=earlier,
        )
        self._unwritten = None

    async def record(self, call: ToolCallRecord) -> None:
        """Upsert one journal row. A deferred round is written first: recovery reads rounds
        in order, so no later round's row may be durable before it."""
        await self.flush()
        await self.store.record_call(self.turn_id, lease_token=self.lease_token, call=call)

    async def flush(self) -> None:
        """Write the deferred round if no write has carried it yet."""
        if self._unwritten is not None:
            closed, rows = self._unwritten
            await self.store.save_round(
                self.turn_id, lease_token=self.lease_token, round=closed, calls=rows
            )
            self._unwritten = None
