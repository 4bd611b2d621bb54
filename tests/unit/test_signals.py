"""The wake-ups stores and pools wait on: broadcast to current waiters, timeouts, and no
state kept for waits that are over."""

from __future__ import annotations

import asyncio

from engine.store.signals import (
    MAX_GATHERED_CHANGES,
    AbortSignal,
    BroadcastSignal,
    ChangeSubscriptions,
    KeyedSignals,
    TurnChanges,
    WakeEvent,
)


async def test_a_fire_wakes_every_current_waiter_and_not_later_ones() -> None:
    """Every waiter at the time of the fire returns; one that starts afterwards waits for
    the next fire (here: its timeout)."""
    signal = BroadcastSignal()
    waiters = [asyncio.create_task(signal.wait(5.0)) for _ in range(3)]
    await asyncio.sleep(0)
    signal.fire()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 1.0) == [True, True, True]
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await signal.wait(0.05) is False
    assert loop.time() - started >= 0.04
    assert not signal.waiting


async def test_a_wait_without_a_fire_returns_after_its_timeout() -> None:
    """No fire: the wait ends after the timeout, without raising."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    await BroadcastSignal().wait(0.05)
    assert 0.04 <= loop.time() - started < 1.0


async def test_a_wake_event_set_before_the_wait_returns_at_once_until_cleared() -> None:
    """A set WakeEvent answers waits at once; after clear they wait for the next set."""
    event = WakeEvent()
    event.set()
    await asyncio.wait_for(event.wait(5.0), 0.5)
    event.clear()
    assert not event.is_set()
    waiter = asyncio.create_task(event.wait(5.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    event.set()
    await asyncio.wait_for(waiter, 0.5)


async def test_keyed_signals_keep_nothing_once_their_waits_are_over() -> None:
    """Whether a wait ends by a fire, a timeout or a cancellation, no signal is left behind
    for its key (a process waits on thousands of turns)."""
    signals = KeyedSignals()
    fired = asyncio.create_task(signals.wait("t1", 5.0))
    cancelled = asyncio.create_task(signals.wait("t2", 5.0))
    await asyncio.sleep(0)
    assert len(signals) == 2
    signals.fire("t1")
    await asyncio.wait_for(fired, 0.5)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    await signals.wait("t3", 0.01)  # timed out
    assert len(signals) == 0


async def test_a_keyed_signal_stays_while_another_waiter_on_its_key_waits() -> None:
    """Two waiters on one key: the first to time out leaves the signal to the other, whom a
    fire still wakes."""
    signals = KeyedSignals()
    short = asyncio.create_task(signals.wait("t", 0.01))
    long = asyncio.create_task(signals.wait("t", 5.0))
    await asyncio.wait_for(short, 0.5)
    assert len(signals) == 1
    signals.fire("t")
    await asyncio.wait_for(long, 0.5)
    assert len(signals) == 0


async def test_fire_all_wakes_waiters_of_every_key() -> None:
    """fire_all (e.g. after a lost LISTEN connection) wakes everybody."""
    signals = KeyedSignals()
    waiters = [asyncio.create_task(signals.wait(key, 5.0)) for key in ("a", "b", "c")]
    await asyncio.sleep(0)
    signals.fire_all()
    await asyncio.wait_for(asyncio.gather(*waiters), 0.5)
    assert len(signals) == 0


def test_an_abort_signal_calls_each_listener_once_and_late_ones_at_once() -> None:
    """set() calls the listeners added before it, once even if set again; a listener added
    after it is called on the spot; a removed one is never called."""
    signal, calls = AbortSignal(), []
    signal.add_listener(lambda: calls.append("early"))
    removed = lambda: calls.append("removed")  # noqa: E731
    signal.add_listener(removed)
    signal.remove_listener(removed)
    assert not signal.is_set() and calls == []
    signal.set()
    signal.set()
    assert signal.is_set() and calls == ["early"]
    signal.add_listener(lambda: calls.append("late"))
    assert calls == ["early", "late"]
    signal.remove_listener(removed)  # not there any more: no error


async def test_a_subscription_gathers_the_turns_announced_between_its_reads() -> None:
    """Changes announced while the subscriber is busy are kept for its next read, each turn
    once; a read with nothing heard waits out its timeout and comes back empty."""
    feed = ChangeSubscriptions()
    with feed.subscribe() as first, feed.subscribe() as second:
        feed.fire("t1")
        feed.fire("t2")
        feed.fire("t1")
        assert await first.next(1.0) == TurnChanges(frozenset({"t1", "t2"}))
        assert not await first.next(0.05)
        waiting = asyncio.create_task(first.next(5.0))
        await asyncio.sleep(0)
        feed.fire("t3")
        assert await asyncio.wait_for(waiting, 1.0) == TurnChanges(frozenset({"t3"}))
        assert second.take() == TurnChanges(frozenset({"t1", "t2", "t3"}))
    feed.fire("t4")  # nobody subscribes any more: nothing is kept
    assert not first.take()


async def test_a_lost_or_overflowing_announcement_means_everything_may_have_changed() -> None:
    """A fire without an id (a reconnect) and more ids than a subscription keeps both read
    as "everything"; merging with everything gives everything."""
    feed = ChangeSubscriptions()
    with feed.subscribe() as subscription:
        feed.fire("t1")
        feed.fire(None)
        assert subscription.take() == TurnChanges(everything=True)
        for n in range(MAX_GATHERED_CHANGES + 1):
            feed.fire(f"t{n}")
        assert subscription.take() == TurnChanges(everything=True)
    merged = TurnChanges(frozenset({"a"})) | TurnChanges(everything=True)
    assert merged == TurnChanges(everything=True)
    assert TurnChanges(frozenset({"a"})) | TurnChanges(frozenset({"b"})) == TurnChanges(
        frozenset({"a", "b"})
    )
