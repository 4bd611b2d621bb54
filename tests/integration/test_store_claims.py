"""The SessionStore contract on claiming turns: leases taken one at a time or in batches,
by which owner and in which order, and the claim that comes with a settle.

Every test runs on each store of
:data:`~tests.integration.store_support.STORE_FACTORIES` (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from engine.errors import StaleTransitionError
from engine.status import FinishReason, TurnStatus
from engine.store import FollowOnClaim, SessionStore, Transition
from tests.integration.store_support import (
    ABORTING,
    AGENT,
    COMPLETED,
    LEASE,
    PENDING,
    SETTLED,
    SHORT_LEASE,
    assert_recent,
    claim,
    new_turn,
    settle,
    turn_in,
)

# -- claiming ----------------------------------------------------------------------------


async def test_claim_turn_leases_pending_turn(store: SessionStore) -> None:
    """claim_turn sets the lease owner and expiry and increments lease_token and attempts."""
    await store.create_turn(new_turn("t1"))

    leased = await claim(store, "t1", owner="w1", lease_seconds=LEASE)

    assert leased.status is PENDING
    assert (leased.lease_owner, leased.lease_token, leased.attempts) == ("w1", 1, 1)
    assert leased.lease_expires_at is not None
    assert leased.lease_expires_at > datetime.now(UTC) + timedelta(seconds=LEASE / 2)
    assert_recent(leased.lease_expires_at - timedelta(seconds=LEASE))
    assert await store.get_turn("t1") == leased


async def test_claim_turn_refuses_live_lease(store: SessionStore) -> None:
    """Claiming a turn whose lease is live raises StaleTransitionError and changes nothing."""
    await store.create_turn(new_turn("t1"))
    leased = await claim(store, "t1", owner="w1")

    with pytest.raises(StaleTransitionError):
        await claim(store, "t1", owner="w2")

    assert await store.get_turn("t1") == leased


async def test_expired_lease_can_be_claimed_by_another_owner(store: SessionStore) -> None:
    """Once a lease expires another owner can claim the turn and gets a higher token."""
    await store.create_turn(new_turn("t1"))
    first = await claim(store, "t1", owner="w1", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE * 3)

    second = await claim(store, "t1", owner="w2")

    assert second.lease_owner == "w2"
    assert second.lease_token > first.lease_token
    assert second.attempts == first.attempts + 1
    assert second.lease_expires_at is not None and second.lease_expires_at > datetime.now(UTC)


@pytest.mark.parametrize("status", SETTLED)
async def test_settled_turn_cannot_be_claimed(store: SessionStore, status: TurnStatus) -> None:
    """claim_turn on a settled (or unknown) turn raises StaleTransitionError."""
    settled = await turn_in(store, status)

    with pytest.raises(StaleTransitionError):
        await claim(store, "t1", owner="w2")
    with pytest.raises(StaleTransitionError):
        await claim(store, "nope", owner="w2")

    assert await store.get_turn("t1") == settled


async def test_claim_next_takes_oldest_run_after_first_up_to_limit(store: SessionStore) -> None:
    """claim_next leases claimable turns oldest run_after first, at most limit of them."""
    for n in (1, 2, 3):
        await store.create_turn(new_turn(f"t{n}", f"s{n}"))
    token = (await claim(store, "t1")).lease_token
    await asyncio.sleep(0.01)
    await store.transition(
        "t1",
        Transition(expected={PENDING}, new=PENDING, lease_token=token, run_after=datetime.now(UTC)),
    )

    first = await store.claim_next(owner="w2", lease_seconds=LEASE, limit=2)

    assert [c.turn.id for c in first] == ["t2", "t3"]
    for turn in (c.turn for c in first):
        assert (turn.lease_owner, turn.lease_token, turn.attempts) == ("w2", 1, 1)
        assert turn.lease_expires_at is not None and turn.lease_expires_at > datetime.now(UTC)
        assert await store.get_turn(turn.id) == turn
    rest = await store.claim_next(owner="w3", lease_seconds=LEASE, limit=5)
    # Token 1 (first claim) → 2 (the hand-back fences the old worker out) → 3 (this claim).
    assert [(t.turn.id, t.turn.lease_owner, t.turn.lease_token) for t in rest] == [("t1", "w3", 3)]
    assert await store.claim_next(owner="w4", lease_seconds=LEASE, limit=5) == []


async def test_claim_next_filters_by_agent(store: SessionStore) -> None:
    """claim_next with agents leases only turns of those agents."""
    await store.create_turn(new_turn("a1", "s1", agent="alpha"))
    await store.create_turn(new_turn("b1", "s2", agent="beta"))

    assert await store.claim_next(owner="w", lease_seconds=LEASE, limit=5, agents={"gamma"}) == []
    claimed = await store.claim_next(owner="w", lease_seconds=LEASE, limit=5, agents=["beta"])

    assert [t.turn.id for t in claimed] == ["b1"]
    untouched = await store.get_turn("a1")
    assert untouched is not None and (untouched.lease_owner, untouched.attempts) == (None, 0)


async def test_a_settle_claims_the_next_turn_for_the_slot_it_frees(store: SessionStore) -> None:
    """transition(then_claim=) settles the turn, then leases the oldest claimable turn of the
    claim's agents to its owner and reports it; a claim that finds nothing says it ran."""
    await store.create_turn(new_turn("b1", "s2", agent="beta"))
    await store.create_turn(new_turn("a2", "s3"))
    token = (await turn_in(store, PENDING)).lease_token
    follow = FollowOnClaim(owner="w1", lease_seconds=LEASE, agents=[AGENT])

    settled = await store.transition(
        "t1",
        Transition(
            expected={PENDING},
            new=COMPLETED,
            lease_token=token,
            finish_reason=FinishReason.STOP,
            then_claim=follow,
        ),
    )

    assert settled.status is COMPLETED
    leased = [c.turn for c in follow.claimed]
    assert follow.ran and [(t.id, t.lease_owner, t.attempts) for t in leased] == [("a2", "w1", 1)]
    assert await store.get_turn("a2") == leased[0]
    untouched = await store.get_turn("b1")
    assert untouched is not None and untouched.lease_owner is None
    empty = FollowOnClaim(owner="w1", lease_seconds=LEASE, agents=[AGENT])
    await store.transition(
        "a2",
        Transition(
            expected={PENDING},
            new=COMPLETED,
            lease_token=leased[0].lease_token,
            finish_reason=FinishReason.STOP,
            then_claim=empty,
        ),
    )
    assert empty.ran and empty.claimed == []


async def test_a_refused_settle_leases_nothing_it_does_not_report(store: SessionStore) -> None:
    """A settle refused for a stale lease raises as always; whatever its follow-on claim
    leased (a store may run the claim with it) is reported, so its owner can run it."""
    await store.create_turn(new_turn("t2", "s2"))
    leased = await turn_in(store, PENDING)
    follow = FollowOnClaim(owner="w9", lease_seconds=LEASE)

    with pytest.raises(StaleTransitionError):
        await store.transition(
            "t1",
            Transition(
                expected={PENDING},
                new=COMPLETED,
                lease_token=leased.lease_token + 1,
                finish_reason=FinishReason.STOP,
                then_claim=follow,
            ),
        )

    still = await store.get_turn("t1")
    assert still is not None and still.status is PENDING
    other = await store.get_turn("t2")
    assert other is not None
    reported = [t.turn.id for t in follow.claimed]
    assert (other.lease_owner == "w9") == ("t2" in reported)
    assert not follow.claimed or follow.ran


async def test_claim_next_among_leases_only_the_named_claimable_turns(
    store: SessionStore,
) -> None:
    """claim_next(among=ids) leases only claimable turns named in ids (unknown and leased
    ids are passed over), oldest first; an empty among leases nothing."""
    for n in (1, 2, 3, 4):
        await store.create_turn(new_turn(f"t{n}", f"s{n}"))
    await claim(store, "t2")

    assert await store.claim_next(owner="w2", lease_seconds=LEASE, limit=5, among=[]) == []
    claimed = await store.claim_next(
        owner="w2", lease_seconds=LEASE, limit=5, among=["t4", "nope", "t2", "t3"]
    )

    assert [(t.turn.id, t.turn.lease_owner) for t in claimed] == [("t3", "w2"), ("t4", "w2")]
    untouched = await store.get_turn("t1")
    assert untouched is not None and untouched.lease_owner is None
    assert [t.turn.id for t in await store.claim_next(owner="w3", lease_seconds=LEASE)] == ["t1"]


async def test_claim_next_skips_leased_future_and_settled_turns(store: SessionStore) -> None:
    """claim_next never returns a leased turn, a turn whose run_after is ahead, or a settled one."""
    for n in (1, 2, 3, 4):
        await store.create_turn(new_turn(f"t{n}", f"s{n}"))
    leased = await claim(store, "t1")
    token = (await claim(store, "t2")).lease_token
    later = datetime.now(UTC) + timedelta(hours=1)
    await store.transition(
        "t2", Transition(expected={PENDING}, new=PENDING, lease_token=token, run_after=later)
    )
    await settle(store, "t3")
    before = {n: await store.get_turn(f"t{n}") for n in (1, 2, 3)}

    claimed = await store.claim_next(owner="w2", lease_seconds=LEASE, limit=10)

    assert [t.turn.id for t in claimed] == ["t4"]
    assert {n: await store.get_turn(f"t{n}") for n in (1, 2, 3)} == before
    assert before[1] == leased


async def test_concurrent_claim_next_never_share_a_turn(store: SessionStore) -> None:
    """Two concurrent claim_next calls lease disjoint turns, and nothing is leased twice."""
    ids = {f"t{n}" for n in range(6)}
    for turn_id in sorted(ids):
        await store.create_turn(new_turn(turn_id, f"s-{turn_id}"))

    first, second = await asyncio.gather(
        store.claim_next(owner="w1", lease_seconds=LEASE, limit=4),
        store.claim_next(owner="w2", lease_seconds=LEASE, limit=4),
    )

    first_ids, second_ids = {t.turn.id for t in first}, {t.turn.id for t in second}
    assert not first_ids & second_ids
    assert first_ids | second_ids == ids
    assert len(first) + len(second) == len(ids)
    assert await store.claim_next(owner="w3", lease_seconds=LEASE, limit=10) == []


async def test_a_claim_settles_an_aborting_turn_whose_worker_died(store: SessionStore) -> None:
    """An aborting turn with an expired lease is settled aborted by the next claim."""
    await store.create_turn(new_turn("t1"))
    # Long enough that the abort surely lands while the lease is live, on a loaded machine.
    await claim(store, "t1", lease_seconds=1.0)
    assert (await store.request_abort("t1")).status is ABORTING
    await asyncio.sleep(1.1)
    assert await store.claim_next(owner="w2", lease_seconds=LEASE) == []
    settled = await store.get_turn("t1")
    assert settled is not None and settled.status is TurnStatus.ABORTED
    assert settled.finish_reason is FinishReason.ABORTED
    await store.create_turn(new_turn("t2", parent_id="t1"))  # the session is free again
