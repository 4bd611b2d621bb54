"""The SessionStore contract on leases, status transitions and abort requests: who may
move a turn along the state machine, what each edge records, how a lost lease is fenced out.

Every test runs on each store of
:data:`~tests.integration.store_support.STORE_FACTORIES` (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta

import pytest

from engine.errors import LeaseLostError, NotFoundError, StaleTransitionError
from engine.status import ALLOWED_TRANSITIONS, FinishReason, TurnStatus
from engine.store import SessionStore, Transition, TurnError
from tests.databases import events_of
from tests.integration.store_support import (
    ABORTED,
    ABORTING,
    COMPLETED,
    FINISH,
    LEASE,
    PENDING,
    SETTLED,
    SHORT_LEASE,
    assert_recent,
    claim,
    new_turn,
    settle,
    tool_call,
    turn_in,
)

FORBIDDEN_EDGES = [
    (old, new) for old in TurnStatus for new in TurnStatus if new not in ALLOWED_TRANSITIONS[old]
]


# -- leases ------------------------------------------------------------------------------


async def test_renew_lease_extends_lease(store: SessionStore) -> None:
    """renew_lease pushes lease_expires_at forward and keeps token, owner and attempts."""
    await store.create_turn(new_turn("t1"))
    leased = await claim(store, "t1", lease_seconds=1)

    renewed = await store.renew_lease("t1", lease_token=leased.lease_token, lease_seconds=LEASE)

    assert renewed.lease_expires_at is not None and leased.lease_expires_at is not None
    assert renewed.lease_expires_at > leased.lease_expires_at + timedelta(seconds=LEASE / 2)
    assert (renewed.lease_token, renewed.lease_owner, renewed.attempts) == (1, "w1", 1)
    assert renewed.status is PENDING
    assert await store.get_turn("t1") == renewed


async def test_renew_lease_with_stale_token_raises(store: SessionStore) -> None:
    """renew_lease with a token that is no longer the turn's raises LeaseLostError."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1", owner="w1", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE * 3)
    second = await claim(store, "t1", owner="w2")

    with pytest.raises(LeaseLostError):
        await store.renew_lease("t1", lease_token=first.lease_token, lease_seconds=LEASE)
    with pytest.raises(LeaseLostError):
        await store.renew_lease("t1", lease_token=second.lease_token + 1, lease_seconds=LEASE)

    assert await store.get_turn("t1") == second


@pytest.mark.parametrize("status", SETTLED)
async def test_renew_lease_after_settle_raises(store: SessionStore, status: TurnStatus) -> None:
    """renew_lease on a settled turn raises LeaseLostError, even with the last token."""
    settled = await turn_in(store, status)

    with pytest.raises(LeaseLostError):
        await store.renew_lease("t1", lease_token=settled.lease_token, lease_seconds=LEASE)

    assert await store.get_turn("t1") == settled


async def test_renew_lease_reports_aborting(store: SessionStore) -> None:
    """renew_lease returns the current status, so a heartbeat sees an abort request."""
    await store.create_turn(new_turn("t1"))
    leased = await claim(store, "t1")
    assert (await store.request_abort("t1")).status is ABORTING

    renewed = await store.renew_lease("t1", lease_token=leased.lease_token, lease_seconds=LEASE)

    assert renewed.status is ABORTING
    assert (renewed.lease_owner, renewed.lease_token) == ("w1", leased.lease_token)


# -- transitions -------------------------------------------------------------------------


async def test_transition_with_unexpected_status_raises_and_changes_nothing(
    store: SessionStore,
) -> None:
    """transition from a status not in expected raises StaleTransitionError and changes nothing."""
    leased = await turn_in(store, PENDING)
    events = await events_of(store, "t1")

    with pytest.raises(StaleTransitionError):
        await store.transition(
            "t1", Transition(expected={ABORTING}, new=ABORTED, lease_token=leased.lease_token)
        )

    assert await store.get_turn("t1") == leased
    assert await events_of(store, "t1") == events


async def test_transition_with_stale_lease_token_raises_lease_lost(store: SessionStore) -> None:
    """transition with a lease token that is not the turn's raises LeaseLostError."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1", owner="w1", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE * 3)
    second = await claim(store, "t1", owner="w2")
    events = await events_of(store, "t1")

    with pytest.raises(LeaseLostError):
        await store.transition(
            "t1", Transition(expected={PENDING}, new=COMPLETED, lease_token=first.lease_token)
        )

    assert await store.get_turn("t1") == second
    assert await events_of(store, "t1") == events


@pytest.mark.parametrize(
    ("old", "new"), FORBIDDEN_EDGES, ids=[f"{o.value}->{n.value}" for o, n in FORBIDDEN_EDGES]
)
async def test_transition_refuses_edges_outside_state_machine(
    store: SessionStore, old: TurnStatus, new: TurnStatus
) -> None:
    """transition along an edge missing from ALLOWED_TRANSITIONS raises ValueError, no change."""
    before = await turn_in(store, old)
    events = await events_of(store, "t1")

    with pytest.raises(ValueError):
        await store.transition("t1", Transition(expected={old}, new=new, lease_token=None))

    assert await store.get_turn("t1") == before
    assert await events_of(store, "t1") == events


@pytest.mark.parametrize("status", SETTLED)
async def test_settling_releases_lease_and_records_outcome(
    store: SessionStore, status: TurnStatus
) -> None:
    """Settling releases the lease and sets status, settled_at, finish_reason and error."""
    leased = await turn_in(store, PENDING)
    error = TurnError(status="INTERNAL", message="boom", details={"trace": ["a", "b"]})

    settled = await store.transition(
        "t1",
        Transition(
            expected={PENDING},
            new=status,
            lease_token=leased.lease_token,
            finish_reason=FINISH[status],
            error=error,
        ),
    )

    assert settled.status is status
    assert (settled.finish_reason, settled.error) == (FINISH[status], error)
    assert (settled.lease_owner, settled.lease_expires_at) == (None, None)
    assert_recent(settled.settled_at)
    assert settled.updated_at >= leased.updated_at
    assert await store.get_turn("t1") == settled


@pytest.mark.parametrize("status", SETTLED)
async def test_runner_settles_aborting_turn_by_outcome(
    store: SessionStore, status: TurnStatus
) -> None:
    """The lease holder may settle an aborting turn aborted, completed or failed."""
    leased = await turn_in(store, ABORTING)

    settled = await store.transition(
        "t1",
        Transition(
            expected={ABORTING},
            new=status,
            lease_token=leased.lease_token,
            finish_reason=FINISH[status],
        ),
    )

    assert (settled.status, settled.finish_reason) == (status, FINISH[status])
    assert (settled.lease_owner, settled.lease_expires_at) == (None, None)
    assert_recent(settled.settled_at)


async def test_hand_back_sets_run_after_and_releases_lease(store: SessionStore) -> None:
    """pending→pending hands the turn back: lease released, run_after set, not settled."""
    leased = await turn_in(store, PENDING)
    later = datetime.now(UTC) + timedelta(minutes=5)
    error = TurnError(status="UNAVAILABLE", message="model timed out")

    handed = await store.transition(
        "t1",
        Transition(
            expected={PENDING},
            new=PENDING,
            lease_token=leased.lease_token,
            run_after=later,
            error=error,
        ),
    )

    assert handed.status is PENDING
    assert (handed.lease_owner, handed.lease_expires_at, handed.settled_at) == (None, None, None)
    assert abs(handed.run_after - later) < timedelta(milliseconds=1)
    assert handed.error == error
    assert handed.attempts == 1
    assert await store.get_turn("t1") == handed


async def test_transitions_are_recorded_as_events_in_order(store: SessionStore) -> None:
    """Every transition appends a TurnEvent (from, to, attempt, note), oldest first."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1")
    await store.transition(
        "t1",
        Transition(expected={PENDING}, new=PENDING, lease_token=first.lease_token, note="retry"),
    )
    second = await claim(store, "t1")
    assert (await store.request_abort("t1")).status is ABORTING
    await store.transition(
        "t1",
        Transition(
            expected={ABORTING},
            new=ABORTED,
            lease_token=second.lease_token,
            finish_reason=FinishReason.ABORTED,
            note="stopped",
        ),
    )

    events = await events_of(store, "t1")

    assert [(e.turn_id, e.from_status, e.to_status, e.attempt) for e in events] == [
        ("t1", None, PENDING, 0),
        ("t1", PENDING, PENDING, 1),
        ("t1", PENDING, ABORTING, 2),
        ("t1", ABORTING, ABORTED, 2),
    ]
    assert (events[1].note, events[3].note) == ("retry", "stopped")
    for earlier, later in itertools.pairwise(events):
        assert earlier.at <= later.at
    assert_recent(events[-1].at)


async def test_hand_back_fences_out_the_worker_that_handed_back(store: SessionStore) -> None:
    """After a pending→pending hand-back the old lease token can write nothing."""
    await store.create_turn(new_turn("t1"))
    token = (await claim(store, "t1")).lease_token
    handed = await store.transition(
        "t1",
        Transition(expected={PENDING}, new=PENDING, lease_token=token, run_after=datetime.now(UTC)),
    )
    assert handed.lease_token != token
    with pytest.raises(LeaseLostError):
        await store.record_call("t1", lease_token=token, call=tool_call("t1", 1, "r1"))
    with pytest.raises(LeaseLostError):
        await store.transition(
            "t1", Transition(expected={PENDING}, new=COMPLETED, lease_token=token)
        )


async def test_settling_replaces_an_earlier_attempts_error(store: SessionStore) -> None:
    """A turn that failed transiently and then completed carries no error."""
    await store.create_turn(new_turn("t1"))
    token = (await claim(store, "t1")).lease_token
    await store.transition(
        "t1",
        Transition(
            expected={PENDING},
            new=PENDING,
            lease_token=token,
            error=TurnError(status="UNAVAILABLE", message="flaky"),
            run_after=datetime.now(UTC),
        ),
    )
    failed_once = await store.get_turn("t1")
    assert failed_once is not None and failed_once.error is not None
    settled = await settle(store, "t1")
    reread = await store.get_turn("t1")
    assert settled.error is None and reread is not None and reread.error is None


# -- abort -------------------------------------------------------------------------------


async def test_request_abort_of_leased_pending_turn_is_aborting(store: SessionStore) -> None:
    """request_abort on a leased pending turn moves it to aborting and keeps the lease."""
    leased = await turn_in(store, PENDING)

    assert (await store.request_abort("t1")).status is ABORTING

    current = await store.get_turn("t1")
    assert current is not None and current.status is ABORTING
    assert (current.lease_owner, current.lease_token) == ("w1", leased.lease_token)
    assert (current.settled_at, current.finish_reason) == (None, None)


@pytest.mark.parametrize("how", ["never-claimed", "handed-back", "lease-expired"])
async def test_request_abort_of_unleased_pending_turn_is_aborted(
    store: SessionStore, how: str
) -> None:
    """request_abort on a pending turn nobody holds settles it aborted at once."""
    await store.create_turn(new_turn("t1"))
    if how == "handed-back":
        token = (await claim(store, "t1")).lease_token
        later = datetime.now(UTC) + timedelta(hours=1)
        await store.transition(
            "t1", Transition(expected={PENDING}, new=PENDING, lease_token=token, run_after=later)
        )
    elif how == "lease-expired":
        await claim(store, "t1", lease_seconds=SHORT_LEASE)
        await asyncio.sleep(SHORT_LEASE * 3)

    assert (await store.request_abort("t1")).status is ABORTED

    current = await store.get_turn("t1")
    assert current is not None
    assert (current.status, current.finish_reason) == (ABORTED, FinishReason.ABORTED)
    assert_recent(current.settled_at)
    assert (await events_of(store, "t1"))[-1].to_status is ABORTED
    created = await store.create_turn(new_turn("t2", parent_id="t1", history_length=1))
    assert created.status is PENDING


@pytest.mark.parametrize("status", [ABORTING, *SETTLED])
async def test_request_abort_leaves_aborting_and_settled_turns_alone(
    store: SessionStore, status: TurnStatus
) -> None:
    """request_abort on an aborting or settled turn returns its status and changes nothing."""
    before = await turn_in(store, status)
    events = await events_of(store, "t1")

    assert (await store.request_abort("t1")).status is status

    assert await store.get_turn("t1") == before
    assert await events_of(store, "t1") == events


async def test_request_abort_of_unknown_turn_raises_not_found(store: SessionStore) -> None:
    """request_abort on an unknown turn raises NotFoundError."""
    with pytest.raises(NotFoundError):
        await store.request_abort("nope")
