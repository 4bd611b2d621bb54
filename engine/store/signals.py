"""Wake-ups for waiters with a timeout, without a task per wait.

``asyncio.wait_for`` runs its awaitable in a new task on Python 3.11, and the worker pool and
every caller awaiting a settlement wait several times per turn; a bare future with a timer
costs a fraction of that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "AbortSignal",
    "BroadcastSignal",
    "ChangeSubscription",
    "ChangeSubscriptions",
    "KeyedSignals",
    "TurnChanges",
    "WakeEvent",
]


class AbortSignal:
    """A flag that calls its listeners when set: how ``abort`` in this process reaches the
    runner of a turn running here.

    A listener, not a waiter: an :class:`asyncio.Event` needs a task waiting on it for every
    running turn, which almost always ends cancelled, unset: a task started and cancelled
    for nothing on every turn.
    """

    def __init__(self) -> None:
        self._set = False
        self._listeners: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        """Whether :meth:`set` was called."""
        return self._set

    def set(self) -> None:
        """Set the flag and call every listener once (later listeners are called at once)."""
        if self._set:
            return
        self._set = True
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the flag is set; now, if it already is."""
        if self._set:
            listener()
        else:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener`` (no error if it was not added, or already called)."""
        if listener in self._listeners:
            self._listeners.remove(listener)


class BroadcastSignal:
    """A wake-up for many waiters: every waiter at the time of :meth:`fire` returns."""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[bool]] = set()

    @property
    def waiting(self) -> bool:
        """Whether anybody waits on this signal now."""
        return bool(self._waiters)

    def fire(self) -> None:
        """Wake every current waiter (later waiters wait for the next fire)."""
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            _release(waiter, True)

    async def wait(self, timeout: float) -> bool:
        """Until the next :meth:`fire` (``True``), or ``timeout`` seconds (``False``)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.add(waiter)
        timer = loop.call_later(timeout, _release, waiter, False)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)


class KeyedSignals:
    """One :class:`BroadcastSignal` per key (a turn id), kept only while somebody waits.

    A long-lived process waits on thousands of turns; most waits end without a fire (the
    turn had already settled, or the wait timed out), and a signal kept for each of those
    would never be freed.
    """

    def __init__(self) -> None:
        self._signals: dict[str, BroadcastSignal] = {}

    def __len__(self) -> int:
        return len(self._signals)

    def waited_on(self, key: str) -> bool:
        """Whether somebody waits on ``key`` now."""
        return key in self._signals

    def fire(self, key: str) -> None:
        """Wake everybody waiting on ``key``."""
        signal = self._signals.pop(key, None)
        if signal is not None:
            signal.fire()

    def fire_all(self) -> None:
        """Wake every waiter, whatever its key (e.g. notifications may have been lost)."""
        signals, self._signals = self._signals, {}
        for signal in signals.values():
            signal.fire()

    async def wait(self, key: str, timeout: float) -> None:
        """Until :meth:`fire` of ``key`` (or :meth:`fire_all`), or ``timeout`` seconds."""
        signal = self._signals.get(key)
        if signal is None:
            signal = self._signals[key] = BroadcastSignal()
        try:
            await signal.wait(timeout)
        finally:
            if not signal.waiting and self._signals.get(key) is signal:
                del self._signals[key]


class WakeEvent:
    """A flag like :class:`asyncio.Event`, whose :meth:`wait` takes a timeout."""

    def __init__(self) -> None:
        self._flag = False
        self._signal = BroadcastSignal()

    def is_set(self) -> bool:
        """Whether :meth:`set` was called since the last :meth:`clear`."""
        return self._flag

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        self._flag = True
        self._signal.fire()

    def clear(self) -> None:
        """Reset the flag; later waiters wait for the next :meth:`set`."""
        self._flag = False

    async def wait(self, timeout: float) -> None:
        """At once if the flag is set, else until :meth:`set` or ``timeout`` seconds."""
        if not self._flag:
            await self._signal.wait(timeout)


def _release(waiter: asyncio.Future[bool], fired: bool) -> None:
    if not waiter.done():
        waiter.set_result(fired)


#: Turn ids a subscription gathers before it just says "everything may have changed".
MAX_GATHERED_CHANGES = 1_000


@dataclass(frozen=True)
class TurnChanges:
    """What a change subscription heard since it was last asked: the ids of the turns
    announced, or ``everything`` when announcements may have been lost (a reconnect) or were
    too many to keep, so that any turn may have changed."""

    turn_ids: frozenset[str] = frozenset()
    everything: bool = False

    def __bool__(self) -> bool:
        return self.everything or bool(self.turn_ids)

    def __or__(self, other: TurnChanges) -> TurnChanges:
        everything = self.everything or other.everything
        return TurnChanges(
            frozenset() if everything else self.turn_ids | other.turn_ids, everything
        )


class ChangeSubscription:
    """The turn changes announced to one subscriber (an open page's event stream), gathered
    between its reads so that none is missed while it acts on the previous ones."""

    def __init__(self) -> None:
        self._turn_ids: set[str] = set()
        self._everything = False
        self._heard = asyncio.Event()

    def add(self, turn_id: str | None) -> None:
        """Note a change of ``turn_id`` (``None``: any turn may have changed)."""
        if turn_id is None or len(self._turn_ids) >= MAX_GATHERED_CHANGES:
            self._everything = True
            self._turn_ids.clear()
        elif not self._everything:
            self._turn_ids.add(turn_id)
        self._heard.set()

    async def next(self, timeout: float) -> TurnChanges:
        """The changes heard since the previous call, waiting up to ``timeout`` seconds for
        the first (empty: none came)."""
        if not self._heard.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heard.wait(), timeout)
        return self.take()

    def take(self) -> TurnChanges:
        """The changes heard since the previous call, without waiting."""
        changes = TurnChanges(frozenset(self._turn_ids), self._everything)
        self._turn_ids, self._everything = set(), False
        self._heard.clear()
        return changes


class ChangeSubscriptions:
    """Hands every announced turn change to each current subscriber."""

    def __init__(self) -> None:
        self._subscriptions: set[ChangeSubscription] = set()

    def fire(self, turn_id: str | None) -> None:
        """Announce a change of ``turn_id`` (``None``: any turn may have changed)."""
        for subscription in self._subscriptions:
            subscription.add(turn_id)

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[ChangeSubscription]:
        """A subscription for as long as the block runs."""
        subscription = ChangeSubscription()
        self._subscriptions.add(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.discard(subscription)
