"""The in-memory SessionStore: the reference implementation of the protocol.

It lives in ``engine`` (and is re-exported by :mod:`stores`) because agents without a store
use it too: a client-managed turn runs against a scratch in-memory store seeded from the
verified state blob, so there is one turn runner for every mode.

All methods run without awaiting in between reads and writes, so on one event loop each call
is atomic — the same guarantee the SQL store gets from one transaction per call.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any

from engine.conversation.parts import Message
from engine.errors import (
    ApprovalNotPendingError,
    InvalidArgumentError,
    NotFoundError,
    StaleTransitionError,
)
from engine.model import ModelUsage
from engine.status import ACTIVE_STATUSES, FinishReason, TurnStatus
from engine.store import (
    PAUSED,
    AbortOutcome,
    ApprovalQuery,
    ApprovalRule,
    Assignment,
    AssignmentChange,
    ClaimedTurn,
    DecidedApproval,
    DecisionQuery,
    DueQuery,
    InterruptAnswer,
    NewTurn,
    OpenApproval,
    PendingApproval,
    RoundRecord,
    SessionRecord,
    StoredSnapshot,
    TimelineEntry,
    ToolCallRecord,
    ToolCallStatus,
    Transition,
    TurnEvent,
    TurnProgress,
    TurnQuery,
    TurnRecord,
    TurnRow,
    Vote,
    VoteOutcome,
    WaitingApproval,
    WebhookDelivery,
    WebhookSettlement,
)
from engine.store.history import (
    CLAIMED,
    STATUS,
    HistoryEntry,
    assignment_entry,
    call_entries,
    claim_entries,
    decision_entry,
    delivery_entry,
    settlement_entry,
    vote_entry,
)
from engine.store.relay import ChunkBroker, ChunkSubscription
from engine.store.rules import (
    ABANDONED_ABORT,
    abort_target,
    apply_change,
    check_answerable,
    check_answers,
    check_lease,
    check_not_busy,
    check_parent,
    check_session,
    check_transition,
    claim_after,
    settled_fields,
    transition_changes,
)
from engine.store.signals import (
    ChangeSubscription,
    ChangeSubscriptions,
    KeyedSignals,
    WakeEvent,
)

__all__ = ["InMemorySessionStore", "list_events"]


def _now() -> datetime:
    return datetime.now(UTC)


def _plus(total: int | None, more: int | None) -> int | None:
    """A usage total plus one call's count (unreported counts change nothing)."""
    if more is None:
        return total
    return (total or 0) + more


class InMemorySessionStore:
    """A :class:`~engine.store.SessionStore` kept in process memory (lost on exit): the
    reference implementation every rule of the port is checked against."""

    durable = False
    #: Every change happens in this process, so waiters hear all of them.
    live_changes = True

    def __init__(self) -> None:
        super().__init__()
        self._any_change = ChangeSubscriptions()
        # Sticky: a wake-up that fires between a worker's empty claim and its wait is kept.
        self._work = WakeEvent()
        self._changes = KeyedSignals()
        self._chunks = ChunkBroker()
        self._sessions: dict[str, SessionRecord] = {}
        self._turns: dict[str, TurnRecord] = {}
        self._turn_order: dict[str, list[str]] = {}
        self._rounds: dict[str, dict[int, RoundRecord]] = {}
        self._calls: dict[str, dict[tuple[int, str], ToolCallRecord]] = {}
        self._events: dict[str, list[TurnEvent]] = {}
        self._votes: dict[str, dict[tuple[int, str], list[Vote]]] = {}
        self._assignments: dict[tuple[str, int, str], Assignment] = {}
        self._deliveries: dict[str, WebhookDelivery] = {}
        #: Each agent definition a turn was pinned to, by fingerprint (first one kept).
        self._definitions: dict[str, dict[str, Any]] = {}

    # -- turns -------------------------------------------------------------------------

    async def create_turn(
        self, turn: NewTurn, *, answers: Sequence[InterruptAnswer] = ()
    ) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.create_turn`."""
        return self._create(turn, answers, _now(), announce=True).model_copy(deep=True)

    async def create_claimed_turn(
        self,
        turn: NewTurn,
        *,
        answers: Sequence[InterruptAnswer] = (),
        owner: str,
        lease_seconds: float,
    ) -> ClaimedTurn:
        """See :meth:`engine.store.SessionStore.create_claimed_turn`."""
        now = _now()
        created = self._create(turn, answers, now, announce=False)
        return self._lease(created, owner, lease_seconds, now)

    def _create(
        self, turn: NewTurn, answers: Sequence[InterruptAnswer], now: datetime, *, announce: bool
    ) -> TurnRecord:
        """Check and create the pending turn; ``announce``: wake the workers for it."""
        session = self._sessions.get(turn.session_id)
        if session is not None:
            check_session(session, turn)
        if turn.id in self._turns:
            raise InvalidArgumentError(f"Turn {turn.id} already exists.")
        for turn_id in self._turn_order.get(turn.session_id, []):
            active = self._turns[turn_id]
            if active.status in ACTIVE_STATUSES:
                check_not_busy(turn.session_id, (active.id, active.status))
        # Check every answer before writing anything: all or nothing.
        answered: list[tuple[ToolCallRecord, InterruptAnswer]] = []
        check_answers(turn, answers)
        for answer in answers:
            call = self._calls.get(answer.turn_id, {}).get((answer.round, answer.ref))
            decider = check_answerable(call, answer)
            assert call is not None  # checked above
            answered.append((call, answer.model_copy(update={"decided_by": decider})))
        order = self._turn_order.get(turn.session_id, [])
        check_parent(turn, order[-1] if order else None)
        if session is None:
            session = SessionRecord(
                id=turn.session_id,
                agent=turn.agent,
                owner=turn.owner,
                created_at=now,
                updated_at=now,
            )
        self._sessions[turn.session_id] = session.model_copy(update={"updated_at": now})
        for call, answer in answered:
            if call.decided_at is None:
                self._append(
                    answer.turn_id,
                    decision_entry(call, answer.answer, answer.decided_by, now),
                )
            self._calls[answer.turn_id][(answer.round, answer.ref)] = call.model_copy(
                update={
                    "status": ToolCallStatus.ANSWERED,
                    "answer": answer.answer,
                    "decided_by": answer.decided_by,
                    # An inbox decision recorded earlier keeps its own moment.
                    "decided_at": call.decided_at or now,
                }
            )
        record = TurnRecord(
            id=turn.id,
            session_id=turn.session_id,
            agent=turn.agent,
            parent_id=turn.parent_id,
            status=TurnStatus.PENDING,
            input=turn.input.model_copy(deep=True),
            history_length=turn.history_length,
            max_attempts=turn.max_attempts,
            run_after=now,
            created_at=now,
            updated_at=now,
            trace_context=dict(turn.trace_context) if turn.trace_context else None,
            custom=copy.deepcopy(turn.custom),
            artifacts=copy.deepcopy(turn.artifacts),
            app_version=turn.app_version,
            definition_fingerprint=turn.definition_fingerprint,
        )
        if turn.definition_fingerprint is not None and turn.definition is not None:
            self._definitions.setdefault(
                turn.definition_fingerprint, copy.deepcopy(turn.definition)
            )
        self._turns[turn.id] = record
        self._turn_order.setdefault(turn.session_id, []).append(turn.id)
        self._rounds[turn.id] = {}
        self._calls[turn.id] = {}
        if turn.initial_messages:
            self._rounds[turn.id][0] = RoundRecord(
                round=0, messages=[m.copy_deep() for m in turn.initial_messages], committed=True
            )
        if announce:
            self._work.set()
        self._any_change.fire(turn.id)
        self._events[turn.id] = [
            TurnEvent(
                turn_id=turn.id,
                from_status=None,
                to_status=TurnStatus.PENDING,
                attempt=0,
                at=now,
                note=turn.note,
            )
        ]
        return record

    async def read_definition(self, fingerprint: str) -> dict[str, Any] | None:
        """See :meth:`engine.store.SessionStore.read_definition`."""
        kept = self._definitions.get(fingerprint)
        return copy.deepcopy(kept) if kept is not None else None

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """See :meth:`engine.store.SessionStore.get_session`."""
        session = self._sessions.get(session_id)
        return session.model_copy(deep=True) if session else None

    async def get_turn(self, turn_id: str) -> TurnRecord | None:
        """See :meth:`engine.store.SessionStore.get_turn`."""
        turn = self._turns.get(turn_id)
        return turn.model_copy(deep=True) if turn else None

    async def latest_turn(self, session_id: str) -> TurnRecord | None:
        """See :meth:`engine.store.SessionStore.latest_turn`."""
        order = self._turn_order.get(session_id)
        return self._turns[order[-1]].model_copy(deep=True) if order else None

    def _settle_abandoned_aborts(self, now: datetime) -> None:
        """Settle ``aborting`` turns whose worker died (lease expired), as claims do."""
        for turn in list(self._turns.values()):
            expired = turn.lease_expires_at is not None and turn.lease_expires_at < now
            if turn.status is TurnStatus.ABORTING and expired:
                self._move(turn, ABANDONED_ABORT, now)

    def _claimable(self, turn: TurnRecord, now: datetime) -> bool:
        return (
            turn.status is TurnStatus.PENDING
            and turn.run_after <= now
            and (turn.lease_expires_at is None or turn.lease_expires_at < now)
        )

    def _lease(
        self, turn: TurnRecord, owner: str, lease_seconds: float, now: datetime
    ) -> ClaimedTurn:
        leased = turn.model_copy(
            update={
                "lease_owner": owner,
                "lease_expires_at": now + timedelta(seconds=lease_seconds),
                "lease_token": turn.lease_token + 1,
                "attempts": turn.attempts + 1,
                "updated_at": now,
            }
        )
        self._turns[turn.id] = leased
        for entry in claim_entries(turn, leased):
            self._append(turn.id, entry)
        return ClaimedTurn(turn=leased.model_copy(deep=True), progress=self._progress(leased))

    async def claim_turn(self, turn_id: str, *, owner: str, lease_seconds: float) -> ClaimedTurn:
        """See :meth:`engine.store.SessionStore.claim_turn`."""
        now = _now()
        self._settle_abandoned_aborts(now)
        turn = self._turns.get(turn_id)
        if turn is None or not self._claimable(turn, now):
            raise StaleTransitionError(turn_id, f"Turn {turn_id} is not claimable.")
        return self._lease(turn, owner, lease_seconds, now)

    async def claim_next(
        self,
        *,
        owner: str,
        lease_seconds: float,
        limit: int = 1,
        agents: Collection[str] | None = None,
        among: Collection[str] | None = None,
        versions: Collection[str] | None = None,
    ) -> list[ClaimedTurn]:
        """See :meth:`engine.store.SessionStore.claim_next`."""
        if limit < 1:
            raise ValueError("limit must be at least 1.")
        now = _now()
        self._settle_abandoned_aborts(now)
        ids = self._turns.keys() if among is None else self._turns.keys() & set(among)
        pool = (self._turns[i] for i in ids)
        candidates = sorted(
            (
                t
                for t in pool
                if self._claimable(t, now)
                and (agents is None or t.agent in agents)
                and (versions is None or t.app_version is None or t.app_version in versions)
            ),
            key=lambda t: (t.run_after, t.created_at, t.id),
        )
        return [self._lease(t, owner, lease_seconds, now) for t in candidates[:limit]]

    def _fenced(self, turn_id: str, lease_token: int) -> TurnRecord:
        turn = self._turns.get(turn_id)
        check_lease(turn_id, lease_token, turn)
        assert turn is not None
        return turn

    async def renew_lease(
        self, turn_id: str, *, lease_token: int, lease_seconds: float
    ) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.renew_lease`."""
        turn = self._fenced(turn_id, lease_token)
        now = _now()
        renewed = turn.model_copy(
            update={"lease_expires_at": now + timedelta(seconds=lease_seconds), "updated_at": now}
        )
        self._turns[turn_id] = renewed
        return renewed.model_copy(deep=True)

    async def transition(self, turn_id: str, change: Transition) -> TurnRecord:
        """See :meth:`engine.store.SessionStore.transition`."""
        turn = check_transition(self._turns.get(turn_id), turn_id, change)
        if change.saves:
            # Nothing awaits between the check above and these writes: atomic in this loop.
            self._add_usage(turn, change.usage)
            self._save(turn_id, change.round, change.calls)
            turn = self._turns[turn_id]
        moved = self._move(turn, change, _now())
        if change.then_claim is not None:
            await claim_after(self, change.then_claim)
        return moved

    def _add_usage(self, turn: TurnRecord, usage: ModelUsage | None) -> TurnRecord:
        if usage is not None:
            turn = turn.model_copy(
                update={
                    "input_tokens": _plus(turn.input_tokens, usage.input_tokens),
                    "output_tokens": _plus(turn.output_tokens, usage.output_tokens),
                }
            )
            self._turns[turn.id] = turn
        return turn

    def _move(self, turn: TurnRecord, change: Transition, now: datetime) -> TurnRecord:
        """Apply a checked transition and record its event."""
        turn_id = turn.id
        moved = turn.model_copy(update=transition_changes(change, turn.lease_token, now))
        self._turns[turn_id] = moved
        self._changes.fire(turn_id)
        self._any_change.fire(turn_id)
        if change.new is TurnStatus.PENDING:
            self._work.set()
        self._events[turn_id].append(
            TurnEvent(
                turn_id=turn_id,
                from_status=turn.status,
                to_status=change.new,
                attempt=turn.attempts,
                at=now,
                note=change.note,
                actor=turn.lease_owner if change.lease_token is not None else None,
            )
        )
        return moved.model_copy(deep=True)

    async def request_abort(self, turn_id: str) -> AbortOutcome:
        """See :meth:`engine.store.SessionStore.request_abort`."""
        turn = self._turns.get(turn_id)
        if turn is None:
            raise NotFoundError(f"Snapshot {turn_id} not found.")
        target = abort_target(turn, _now())
        if target is None:
            return AbortOutcome(previous=turn.status, status=turn.status)
        new, finish_reason = target
        moved = await self.transition(
            turn_id,
            Transition(
                expected={TurnStatus.PENDING},
                new=new,
                lease_token=None,
                finish_reason=finish_reason,
                note="abort requested",
            ),
        )
        return AbortOutcome(previous=turn.status, status=moved.status)

    # -- rounds and journal ---------------------------------------------------------

    async def save_round(
        self,
        turn_id: str,
        *,
        lease_token: int,
        round: RoundRecord,
        calls: Sequence[ToolCallRecord] = (),
        usage: ModelUsage | None = None,
        earlier: RoundRecord | None = None,
    ) -> None:
        """See :meth:`engine.store.SessionStore.save_round`."""
        self._add_usage(self._fenced(turn_id, lease_token), usage)
        if earlier is not None:
            self._save(turn_id, earlier, ())
        self._save(turn_id, round, calls)

    def _save(
        self, turn_id: str, round: RoundRecord | None, calls: Sequence[ToolCallRecord]
    ) -> None:
        if round is not None and round.committed and round.state is not None:
            self._turns[turn_id] = self._turns[turn_id].model_copy(
                update={
                    "custom": copy.deepcopy(round.state.custom),
                    "artifacts": round.state.artifacts_wire(),
                }
            )
        if round is not None:
            self._rounds[turn_id][round.round] = RoundRecord(
                round=round.round,
                messages=[m.copy_deep() for m in round.messages],
                committed=round.committed,
            )
        for call in calls:
            self._upsert_call(turn_id, call)

    async def record_call(self, turn_id: str, *, lease_token: int, call: ToolCallRecord) -> None:
        """See :meth:`engine.store.SessionStore.record_call`."""
        self._fenced(turn_id, lease_token)
        self._upsert_call(turn_id, call)

    def _upsert_call(self, turn_id: str, call: ToolCallRecord) -> None:
        # created_at keeps the first write's time, as the SQL journal does.
        earlier = self._calls[turn_id].get((call.round, call.ref))
        for entry in call_entries(earlier, call, self._worker(turn_id), _now()):
            self._append(turn_id, entry)
        created = earlier.created_at if earlier is not None else None
        self._calls[turn_id][(call.round, call.ref)] = call.model_copy(
            deep=True, update={"created_at": created or call.created_at or _now()}
        )

    async def load_rounds(self, turn_id: str) -> list[RoundRecord]:
        """See :meth:`engine.store.SessionStore.load_rounds`."""
        return self._rounds_of(turn_id)

    def _rounds_of(self, turn_id: str) -> list[RoundRecord]:
        rounds = self._rounds.get(turn_id, {})
        return [rounds[r].model_copy(deep=True) for r in sorted(rounds)]

    async def list_calls(self, turn_id: str) -> list[ToolCallRecord]:
        """See :meth:`engine.store.SessionStore.list_calls`."""
        return self._calls_of(turn_id)

    def _calls_of(self, turn_id: str) -> list[ToolCallRecord]:
        calls = self._calls.get(turn_id, {})
        return [calls[key].model_copy(deep=True) for key in sorted(calls)]

    async def read_progress(self, turn_id: str) -> TurnProgress | None:
        """See :meth:`engine.store.SessionStore.read_progress`."""
        turn = self._turns.get(turn_id)
        return None if turn is None else self._progress(turn)

    def _progress(self, turn: TurnRecord) -> TurnProgress:
        """The turn's progress, read without yielding to another task (one moment), as a
        claim returns it with the turn."""
        parent = turn.parent_id
        return TurnProgress(
            parent_conversation=self._conversation(parent) if parent else [],
            parent_journal=self._calls_of(parent) if parent else [],
            rounds=self._rounds_of(turn.id),
            journal=self._calls_of(turn.id),
        )

    async def read_snapshot(self, turn_id: str) -> StoredSnapshot | None:
        """See :meth:`engine.store.SessionStore.read_snapshot`."""
        turn = self._turns.get(turn_id)
        if turn is None:
            return None
        # No await in between reaches another task: the three reads see one moment.
        return StoredSnapshot(
            turn=turn.model_copy(deep=True),
            conversation=await self.load_conversation(turn_id),
            journal=await self.list_calls(turn_id),
        )

    async def load_conversation(self, turn_id: str) -> list[Message]:
        """See :meth:`engine.store.SessionStore.load_conversation`."""
        return self._conversation(turn_id)

    def _conversation(self, turn_id: str) -> list[Message]:
        # Walk up to the root collecting (turn, prefix length), then replay downwards.
        chain: list[TurnRecord] = []
        current = self._turns.get(turn_id)
        if current is None:
            raise NotFoundError(f"Snapshot {turn_id} not found.")
        while current is not None:
            chain.append(current)
            current = self._turns.get(current.parent_id) if current.parent_id else None
        messages: list[Message] = []
        for turn in reversed(chain):
            messages = messages[: turn.history_length]
            rounds = self._rounds.get(turn.id, {})
            for number in sorted(rounds):
                if rounds[number].committed:
                    messages.extend(rounds[number].messages)
        return [m.copy_deep() for m in messages]

    async def list_expired_interrupts(
        self, *, now: datetime, limit: int = 100, agents: Collection[str] | None = None
    ) -> list[ToolCallRecord]:
        """See :meth:`engine.store.SessionStore.list_expired_interrupts`."""
        expired: list[ToolCallRecord] = []
        for order in self._turn_order.values():
            latest = self._turns[order[-1]]
            if agents is not None and latest.agent not in agents:
                continue
            if (latest.status, latest.finish_reason) != (
                TurnStatus.COMPLETED,
                FinishReason.INTERRUPTED,
            ):
                continue
            for key in sorted(self._calls[latest.id]):
                call = self._calls[latest.id][key]
                if (
                    call.status is ToolCallStatus.INTERRUPTED
                    and call.deadline is not None
                    and call.deadline <= now
                ):
                    expired.append(call.model_copy(deep=True))
        expired.sort(key=lambda c: (c.deadline or now, c.turn_id, c.ref))
        return expired[:limit]

    def _paused_latest(self, turn_id: str) -> TurnRecord | None:
        """The turn, if it is paused and still its session's latest."""
        turn = self._turns.get(turn_id)
        if turn is None or self._turn_order[turn.session_id][-1] != turn_id:
            return None
        if (turn.status, turn.finish_reason) != (TurnStatus.COMPLETED, FinishReason.INTERRUPTED):
            return None
        return turn

    async def list_approvals(self, query: ApprovalQuery) -> list[PendingApproval]:
        """See :meth:`engine.store.SessionStore.list_approvals`."""
        found: list[PendingApproval] = []
        for order in self._turn_order.values():
            turn = self._paused_latest(order[-1])
            if turn is None:
                continue
            session = self._sessions[turn.session_id]
            for call in self._calls[turn.id].values():
                if call.status is not ToolCallStatus.INTERRUPTED or call.decided_at is not None:
                    continue
                entry = PendingApproval.of(turn, call, session.owner)
                if query.admits(entry):
                    found.append(entry)
        found.sort(key=lambda e: (e.created_at, e.turn_id, e.ref), reverse=query.descending)
        return found[: query.limit]

    async def list_turns(self, query: TurnQuery) -> list[TurnRow]:
        """See :meth:`engine.store.TurnListing.list_turns`."""
        found = [self._turn_row(turn) for turn in self._turns.values() if self._lists(turn, query)]
        found.sort(key=lambda row: row.key, reverse=True)
        return found[: query.limit]

    def _lists(self, turn: TurnRecord, query: TurnQuery) -> bool:
        """Whether ``query`` selects ``turn``."""
        owner = self._sessions[turn.session_id].owner
        latest = self._turn_order[turn.session_id][-1] == turn.id
        paused = self._paused_latest(turn.id) is not None and any(
            call.status is ToolCallStatus.INTERRUPTED for call in self._calls[turn.id].values()
        )
        statuses = query.statuses or ()
        return (
            (not statuses or (PAUSED in statuses and paused) or turn.status.value in statuses)
            and query.agent in (None, turn.agent)
            and (query.agents is None or turn.agent in query.agents)
            and query.session_id in (None, turn.session_id)
            and (query.owner is None or owner == query.owner)
            and (query.app_version is None or turn.app_version == query.app_version)
            and (query.id_prefix is None or turn.id.startswith(query.id_prefix))
            and (query.since is None or turn.created_at >= query.since)
            and (query.before is None or (turn.created_at, turn.id) < query.before)
            and (latest or not query.latest_only)
        )

    def _turn_row(self, turn: TurnRecord) -> TurnRow:
        """``turn`` as a list shows it, with the undecided approvals it waits for."""
        waiting = [
            WaitingApproval(
                turn_id=turn.id,
                ref=call.ref,
                interrupt=call.name,
                created_at=call.created_at or turn.updated_at,
                input=copy.deepcopy(call.input),
            )
            for call in self._calls[turn.id].values()
            if call.status is ToolCallStatus.INTERRUPTED and call.decided_at is None
        ]
        message = turn.input.message
        texts = [p.text for p in message.content if p.text is not None] if message else []
        return TurnRow(
            id=turn.id,
            session_id=turn.session_id,
            seq=self._turn_order[turn.session_id].index(turn.id) + 1,
            agent=turn.agent,
            parent_id=turn.parent_id,
            status=turn.status,
            finish_reason=turn.finish_reason,
            input_kind=turn.input.kind,
            attempts=turn.attempts,
            max_attempts=turn.max_attempts,
            error=turn.error,
            created_at=turn.created_at,
            updated_at=turn.updated_at,
            settled_at=turn.settled_at,
            waiting=sorted(waiting, key=lambda w: (w.created_at, w.ref)),
            message_text=" ".join(" ".join(texts).split()) or None,
            owner=self._sessions[turn.session_id].owner,
            app_version=turn.app_version,
        )

    async def list_decisions(self, query: DecisionQuery) -> list[DecidedApproval]:
        """See :meth:`engine.store.ApprovalHistory.list_decisions`."""
        found: list[DecidedApproval] = []
        for turn_id, calls in self._calls.items():
            turn = self._turns[turn_id]
            for call in calls.values():
                if call.decided_at is None:
                    continue
                entry = self._decided(turn, call)
                if query.admits(entry):
                    found.append(entry)
        found.sort(key=lambda e: e.key, reverse=True)
        return found[: query.limit]

    def _decided(self, turn: TurnRecord, call: ToolCallRecord) -> DecidedApproval:
        """The history entry of a decided ``call``, with the first turn that continued."""
        assert call.decided_at is not None
        following = next(
            (
                self._turns[t]
                for t in self._turn_order[turn.session_id]
                if self._turns[t].parent_id == turn.id
            ),
            None,
        )
        escalation = self._assignments.get((turn.id, call.round, call.ref))
        return DecidedApproval(
            turn_id=turn.id,
            session_id=turn.session_id,
            agent=turn.agent,
            owner=self._sessions[turn.session_id].owner,
            round=call.round,
            interrupt=call.name,
            ref=call.ref,
            input=call.input,
            metadata=call.interrupt,
            answer=call.answer,
            decided_by=call.decided_by,
            decided_at=call.decided_at,
            created_at=call.created_at,
            next_turn_id=following.id if following else None,
            next_status=following.status if following else None,
            next_finish_reason=following.finish_reason if following else None,
            escalated_at=escalation.escalated_at if escalation else None,
            escalated_from_group=escalation.escalated_from_group if escalation else None,
            escalated_from_assignee=escalation.escalated_from_assignee if escalation else None,
            escalated_to=escalation.escalated_to if escalation else None,
            escalation_step=escalation.escalation_step if escalation else 0,
        )

    async def active_turn_ids(self, owner: str | None, *, limit: int) -> list[str]:
        """Ids of at most ``limit`` pending or aborting turns of ``owner``'s sessions
        (``None``: sessions without an owner); what admission counts per principal."""
        found = [
            turn.id
            for turn in self._turns.values()
            if turn.status in ACTIVE_STATUSES and self._sessions[turn.session_id].owner == owner
        ]
        return found[:limit]

    def _open_call(self, turn_id: str, round: int, ref: str) -> ToolCallRecord:
        """The journal row of an open approval, or the typed conflict saying why it is not
        open."""
        call = self._calls.get(turn_id, {}).get((round, ref))
        if (
            call is None
            or call.status is not ToolCallStatus.INTERRUPTED
            or call.decided_at is not None
            or self._paused_latest(turn_id) is None
        ):
            state = "unknown" if call is None else call.status.value
            if call is not None and call.decided_at is not None:
                state = f"decided by {call.decided_by or 'someone'}"
            raise ApprovalNotPendingError(
                f"Interrupt '{ref}' of snapshot {turn_id} is not pending (it is {state}); it "
                "may have been decided already.",
                snapshot_id=turn_id,
            )
        return call

    async def change_approval(
        self, turn_id: str, round: int, ref: str, rule: ApprovalRule
    ) -> VoteOutcome:
        """See :meth:`engine.store.VoteBook.change_approval` (no await between the read and
        the writes: nothing else runs in between)."""
        call = self._open_call(turn_id, round, ref)
        key = (turn_id, round, ref)
        votes = self._votes.setdefault(turn_id, {}).setdefault((round, ref), [])
        stored = self._assignments.get(key)
        change = rule(
            OpenApproval(
                call=call.model_copy(deep=True),
                votes=[v.model_copy() for v in votes],
                assignment=stored.model_copy() if stored is not None else None,
                now=_now(),
            )
        )
        if change.clear_votes:
            votes.clear()
        if change.vote is not None:
            votes.append(change.vote.model_copy())
            self._append(turn_id, vote_entry(call, change.vote))
        decided = None
        if change.decides:
            decided = call.model_copy(
                update={
                    "answer": change.answer,
                    "decided_by": change.decided_by,
                    "decided_at": _now(),
                }
            )
            assert decided.decided_at is not None
            self._append(
                turn_id,
                decision_entry(call, change.answer, change.decided_by, decided.decided_at),
            )
            self._calls[turn_id][(round, ref)] = decided
            self._add(change.deliveries)
        elif change.vote is not None:
            # No turn changed status: open inbox pages still re-read the vote count.
            self._any_change.fire(turn_id)
        return VoteOutcome(
            votes=[v.model_copy() for v in votes],
            decided=decided.model_copy(deep=True) if decided is not None else None,
        )

    async def list_votes(self, turn_id: str, round: int, ref: str) -> list[Vote]:
        """See :meth:`engine.store.VoteBook.list_votes`."""
        return [v.model_copy() for v in self._votes.get(turn_id, {}).get((round, ref), [])]

    async def get_assignments(
        self, keys: Sequence[tuple[str, int, str]]
    ) -> dict[tuple[str, int, str], Assignment]:
        """See :meth:`engine.store.AssignmentBook.get_assignments`."""
        return {k: self._assignments[k].model_copy() for k in keys if k in self._assignments}

    async def change_assignment(
        self,
        turn_id: str,
        round: int,
        ref: str,
        change: AssignmentChange,
        *,
        default_group: str | None,
    ) -> Assignment | None:
        """See :meth:`engine.store.AssignmentBook.change_assignment`."""
        self._open_call(turn_id, round, ref)
        key = (turn_id, round, ref)
        current = self._assignments.get(key) or Assignment(
            turn_id=turn_id, round=round, ref=ref, group=default_group
        )
        changed = apply_change(current, change, _now())
        if changed is None:
            self._assignments.setdefault(key, current)
            return None
        self._assignments[key] = changed
        self._append(turn_id, assignment_entry(ref, change, changed, change.at or _now()))
        self._add(change.deliveries)
        self._any_change.fire(turn_id)
        return changed.model_copy()

    def _add(self, deliveries: Sequence[WebhookDelivery]) -> int:
        new = [d for d in deliveries if d.id not in self._deliveries]
        for d in new:
            self._deliveries[d.id] = d.model_copy(
                update={"next_attempt_at": d.next_attempt_at or d.occurred_at}
            )
            self._append(d.turn_id, delivery_entry(d, "queued", d.occurred_at))
        return len(new)

    async def add_deliveries(self, deliveries: Sequence[WebhookDelivery]) -> int:
        """See :meth:`engine.store.WebhookOutbox.add_deliveries`."""
        return self._add(deliveries)

    async def opened_watermark(self) -> datetime | None:
        """See :meth:`engine.store.WebhookOutbox.opened_watermark`."""
        opened = [d.occurred_at for d in self._deliveries.values() if d.event == "opened"]
        return max(opened, default=None)

    async def list_unannounced(
        self, interrupts: Collection[tuple[str, str]], *, since: datetime | None, limit: int
    ) -> list[PendingApproval]:
        """See :meth:`engine.store.WebhookOutbox.list_unannounced`."""
        announced = {
            (d.turn_id, d.round, d.ref) for d in self._deliveries.values() if d.event == "opened"
        }
        found = [
            a
            for a in await self.list_approvals(ApprovalQuery(limit=1000))
            if (a.agent, a.interrupt) in set(interrupts)
            and (since is None or a.created_at >= since)
            and (a.turn_id, a.round, a.ref) not in announced
        ]
        return found[:limit]

    async def claim_deliveries(
        self, *, urls: Collection[str], lease_token: str, lease_seconds: float, limit: int
    ) -> list[WebhookDelivery]:
        """See :meth:`engine.store.WebhookOutbox.claim_deliveries`."""
        now = _now()
        due = sorted(
            (
                d
                for d in self._deliveries.values()
                if d.status == "pending"
                and d.url in urls
                and d.next_attempt_at is not None
                and d.next_attempt_at <= now
                and (d.lease_expires_at is None or d.lease_expires_at <= now)
            ),
            key=lambda d: (d.next_attempt_at or now, d.occurred_at, d.id),
        )[:limit]
        claimed = []
        for d in due:
            held = d.model_copy(
                update={
                    "lease_token": lease_token,
                    "lease_expires_at": now + timedelta(seconds=lease_seconds),
                    "attempts": d.attempts + 1,
                }
            )
            self._deliveries[d.id] = held
            claimed.append(held.model_copy())
        return claimed

    async def settle_delivery(self, settlement: WebhookSettlement) -> bool:
        """See :meth:`engine.store.WebhookOutbox.settle_delivery`."""
        held = self._deliveries.get(settlement.id)
        if held is None or held.status != "pending" or held.lease_token != settlement.lease_token:
            return False
        self._deliveries[settlement.id] = held.model_copy(update=settled_fields(settlement))
        self._append(held.turn_id, settlement_entry(held, settlement))
        return True

    async def list_deliveries(
        self, *, turn_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[WebhookDelivery]:
        """See :meth:`engine.store.WebhookOutbox.list_deliveries`."""
        found = sorted(
            (
                d.model_copy()
                for d in self._deliveries.values()
                if (turn_id is None or d.turn_id == turn_id)
                and (status is None or d.status == status)
            ),
            key=lambda d: (d.occurred_at, d.event_id, d.url),
        )
        return found[:limit]

    async def list_due_approvals(self, query: DueQuery) -> list[PendingApproval]:
        """See :meth:`engine.store.AssignmentBook.list_due_approvals`."""
        every = ApprovalQuery(
            agents=query.agents,
            interrupt=query.interrupt,
            created_before=query.created_before,
            limit=1000,
        )
        due: list[PendingApproval] = []
        for entry in await self.list_approvals(every):
            stored = self._assignments.get((entry.turn_id, entry.round, entry.ref))
            step = stored.escalation_step if stored is not None else 0
            if query.escalation_step is not None and step != query.escalation_step:
                continue
            escalated = stored.escalated_at if stored is not None else None
            if query.escalated_before is not None and (
                escalated is None or escalated > query.escalated_before
            ):
                continue
            reminded = stored.last_reminded_at if stored is not None else None
            if query.reminded_before is not None and reminded and reminded > query.reminded_before:
                continue
            due.append(entry)
        return due[: query.limit]

    async def wait_for_work(self, timeout: float) -> None:
        """See :meth:`engine.store.SessionStore.wait_for_work`."""
        await self._work.wait(timeout)
        self._work.clear()

    def take_work_hints(self) -> list[str] | None:
        """None: the in-process wake-up names no turns; pools claim from the whole queue."""
        return None

    async def wait_for_change(self, turn_id: str, timeout: float) -> None:
        """See :meth:`engine.store.SessionStore.wait_for_change`."""
        await self._changes.wait(turn_id, timeout)

    async def timeline(self, turn_id: str) -> list[TimelineEntry]:
        """See :meth:`engine.store.TurnTimeline.timeline`: the turn's history, in order."""
        events = sorted(enumerate(self._events.get(turn_id, [])), key=lambda e: (e[1].at, e[0]))
        return [
            TimelineEntry(
                at=event.at,
                kind=event.kind,
                detail=_describe(event),
                attempt=event.attempt,
                actor=event.actor,
            )
            for _, event in events
        ]

    def _append(self, turn_id: str, entry: HistoryEntry) -> None:
        """Append ``entry`` to the turn's history, at the turn's current attempt."""
        self._events[turn_id].append(
            TurnEvent(
                turn_id=turn_id,
                from_status=None,
                to_status=self._turns[turn_id].status,
                attempt=self._turns[turn_id].attempts if entry.attempt is None else entry.attempt,
                at=entry.at,
                note=entry.note,
                kind=entry.kind,
                actor=entry.actor,
                detail=copy.deepcopy(entry.detail),
            )
        )

    def _worker(self, turn_id: str) -> str | None:
        """The worker that claimed the turn's current attempt (its lease may be gone)."""
        attempt = self._turns[turn_id].attempts
        for event in reversed(self._events.get(turn_id, [])):
            if event.kind == CLAIMED and event.attempt == attempt:
                return event.actor
        return None

    def watch_changes(self) -> AbstractContextManager[ChangeSubscription]:
        """See :meth:`engine.store.ChangeFeed.watch_changes`."""
        return self._any_change.subscribe()

    @contextlib.asynccontextmanager
    async def try_cluster_lock(self, name: str) -> AsyncIterator[bool]:
        """See :meth:`engine.store.Retention.try_cluster_lock`: this store lives in one
        process, whose jobs take turns on its event loop, so the lock is always got."""
        yield True

    async def prune_sessions(self, *, settled_before: datetime, limit: int = 500) -> int:
        """See :meth:`engine.store.SessionStore.prune_sessions`."""
        doomed: list[str] = []
        for session_id, order in self._turn_order.items():
            session = self._sessions[session_id]
            ids = order or []
            in_session = [self._turns[t] for t in ids]
            if (
                session.updated_at >= settled_before
                or any(
                    t.status in ACTIVE_STATUSES or t.updated_at >= settled_before
                    for t in in_session
                )
                or (ids and self._paused_latest(ids[-1]) is not None)
            ):
                continue
            doomed.append(session_id)
        doomed.sort(key=lambda s: self._sessions[s].updated_at)
        gone: set[str] = set()
        for session_id in doomed[:limit]:
            for turn_id in self._turn_order.pop(session_id):
                gone.add(turn_id)
                for table in (self._turns, self._rounds, self._calls, self._events, self._votes):
                    table.pop(turn_id, None)
                for key in [k for k in self._assignments if k[0] == turn_id]:
                    del self._assignments[key]
                for sent in [d.id for d in self._deliveries.values() if d.turn_id == turn_id]:
                    del self._deliveries[sent]
            del self._sessions[session_id]
        # A branch in another session outlives its parent: it holds its own copy of the
        # conversation, and its parent reference goes with the parent.
        for turn_id, turn in list(self._turns.items()):
            if turn.parent_id in gone:
                self._turns[turn_id] = turn.model_copy(update={"parent_id": None})
        return len(doomed[:limit])

    async def publish_chunk(self, turn_id: str, chunk: dict[str, Any]) -> None:
        """See :meth:`engine.store.SessionStore.publish_chunk` (this process only)."""
        self._chunks.deliver(turn_id, chunk)

    def subscribe_chunks(self, turn_id: str) -> AbstractAsyncContextManager[ChunkSubscription]:
        """See :meth:`engine.store.SessionStore.subscribe_chunks`."""
        return self._chunks.subscribe(turn_id)

    async def close(self) -> None:
        """Nothing to release."""


def list_events(store: InMemorySessionStore, turn_id: str) -> list[TurnEvent]:
    """The turn's status transitions in ``store``, oldest first: the audit trail, which the
    engine writes but never reads back (as :func:`stores.turns.list_events` on SQL)."""
    return [e.model_copy(deep=True) for e in store._events.get(turn_id, []) if e.kind == STATUS]


def _describe(event: TurnEvent) -> str:
    """An entry's words on the timeline (a status change as the SQL view ``turn_timeline``
    spells it)."""
    if event.kind != STATUS:
        return event.note or ""
    moved = f"{event.from_status.value if event.from_status else 'new'} -> "
    return moved + event.to_status.value + (f" ({event.note})" if event.note else "")
