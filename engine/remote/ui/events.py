"""``GET /ui/events``: server-sent events telling an open page that something changed.

The stream carries no data of its own, only word: ``change`` when a turn the viewer may see
may have been created or changed (the store's notifications: LISTEN/NOTIFY on PostgreSQL,
in-process for the in-memory store), so the page re-reads what it shows through the same
JSON endpoints it polls otherwise (and the inbox policy applies there, as always). A viewer
whose policy shows only their own sessions' turns hears only of those: the stream must not
tell Bob when Alice acts; ``signed-out`` when the
session ended (logout, revoke, idle, expiry), after which the stream closes. A comment every
few seconds keeps proxies from closing an idle stream.

A store without notifications (SQLite) answers ``204 No Content``: the browser's
``EventSource`` gives up and the page polls, as it does without JavaScript's ``EventSource``.
So does a browser session past :data:`STREAMS_PER_SESSION` open streams, or a principal past
:data:`STREAMS_PER_PRINCIPAL`: it gets ``429``, so one user's tabs or scripts cannot hold the
server's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Sequence

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.engine import Engine
from engine.remote.auth import Principal
from engine.remote.shutdown import shutting_down
from engine.remote.ui.kit import PageKit, Viewer
from engine.remote.ui.queries import Catalog
from engine.store import ChangeFeed
from engine.store.signals import ChangeSubscription, TurnChanges

__all__ = ["EventStream", "live_feeds"]

#: Seconds between keep-alive comments (and looks at whether the session is still live).
HEARTBEAT_SECONDS = 15.0
#: Seconds a burst of changes is gathered into one event (a turn changes several times).
GATHER_SECONDS = 0.25
#: How long one stream lasts before the browser is asked to reconnect (seconds).
MAX_STREAM_SECONDS = 600.0
#: How often a stream looks whether the server is stopping (seconds), between changes.
_CLOSING_CHECK_SECONDS = 1.0
#: Turns whose owner a process remembers for its streams.
_OWNERS_KEPT = 10_000
#: Streams one browser session may hold open at once (a few tabs); the next get 429.
STREAMS_PER_SESSION = 4
#: Streams one principal may hold open at once, across all their browsers.
STREAMS_PER_PRINCIPAL = 16


def live_feeds(engine: Engine) -> list[ChangeFeed]:
    """The distinct stores of the served agents that announce every change."""
    feeds: dict[int, ChangeFeed] = {}
    for agent in engine.agents.values():
        store = agent.store
        if store is not None and store.live_changes:
            feeds.setdefault(id(store), store)
    return list(feeds.values())


async def _next_changes(subscriptions: Sequence[ChangeSubscription], timeout: float) -> TurnChanges:
    """What any subscription heard, waiting up to ``timeout`` seconds for the first."""
    if len(subscriptions) == 1:
        return await subscriptions[0].next(timeout)
    waits = [asyncio.ensure_future(sub.next(timeout)) for sub in subscriptions]
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    return _merged([task.result() for task in done])


def _merged(heard: Sequence[TurnChanges]) -> TurnChanges:
    changes = TurnChanges()
    for more in heard:
        changes = changes | more
    return changes


class _TurnOwners:
    """Who owns the session of a turn, remembered (an owner never changes) for the most
    recently asked turns."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.known: OrderedDict[str, str | None] = OrderedDict()

    async def owner(self, turn_id: str) -> tuple[bool, str | None]:
        """``(found, owner)``: whether a served agent holds the turn, and its owner."""
        if turn_id in self.known:
            self.known.move_to_end(turn_id)
            return True, self.known[turn_id]
        found = await self.catalog.find_turn(turn_id)
        if found is None:
            return False, None
        self.known[turn_id] = found.owner
        if len(self.known) > _OWNERS_KEPT:
            self.known.popitem(last=False)
        return True, found.owner

    async def any_visible(self, principal: Principal | None, changes: TurnChanges) -> bool:
        """Whether ``principal``'s pages may show one of the turns ``changes`` names."""
        if changes.everything:
            return True
        if principal is not None and self.catalog.policy.owner_filter(principal) is None:
            return True  # a policy that shows others' turns: any change may show
        for turn_id in changes.turn_ids:
            found, owner = await self.owner(turn_id)
            if found and self.catalog.may_view_turn(principal, owner):
                return True
        return False


class _HeldStream(StreamingResponse):
    """A stream that gives its holds back when it ends, however it ends."""

    def __init__(self, content: AsyncIterator[str], holds: Counter[str], keys: list[str]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.headers["x-accel-buffering"] = "no"
        self.holds, self.keys = holds, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.holds.subtract(self.keys)
            for key in self.keys:
                if self.holds[key] <= 0:
                    del self.holds[key]


class EventStream:
    """The ``/ui/events`` endpoint of one app."""

    def __init__(self, kit: PageKit, feeds: Sequence[ChangeFeed]) -> None:
        self.kit = kit
        self.feeds = list(feeds)
        #: Open streams per browser session and per principal (this process's).
        self.holds: Counter[str] = Counter()
        self.owners = _TurnOwners(kit.catalog)

    async def events(self, request: Request, viewer: Viewer) -> Response:
        """The event stream of ``viewer`` (204 when the stores cannot announce changes, 429
        when its session or principal holds as many streams as it may)."""
        if not self.feeds:
            return self.kit.finish(Response(status_code=204), request, viewer)
        caps = {f"session:{viewer.session.id or viewer.session.csrf}": STREAMS_PER_SESSION}
        if viewer.id is not None:
            caps[f"principal:{viewer.id}"] = STREAMS_PER_PRINCIPAL
        if any(self.holds[key] >= cap for key, cap in caps.items()):
            refused = Response(status_code=429, headers={"retry-after": "60"})
            return self.kit.finish(refused, request, viewer)
        keys = list(caps)
        self.holds.update(keys)
        return self.kit.finish(_HeldStream(self._stream(viewer), self.holds, keys), request, viewer)

    async def _stream(self, viewer: Viewer) -> AsyncIterator[str]:
        yield "retry: 2000\n\nevent: ready\ndata: {}\n\n"
        started = last_beat = time.monotonic()
        with contextlib.ExitStack() as stack:
            # Subscribed before the first wait, and read between events, so a change arriving
            # while an event is being sent is kept for the next.
            heard = [stack.enter_context(feed.watch_changes()) for feed in self.feeds]
            while not shutting_down() and time.monotonic() - started < MAX_STREAM_SECONDS:
                changes = await _next_changes(heard, _CLOSING_CHECK_SECONDS)
                if changes:
                    await asyncio.sleep(GATHER_SECONDS)
                    changes = _merged([changes, *(sub.take() for sub in heard)])
                    if await self.owners.any_visible(viewer.principal, changes):
                        yield "event: change\ndata: {}\n\n"
                if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                    last_beat = time.monotonic()
                    if not await self._still_signed_in(viewer):
                        yield "event: signed-out\ndata: {}\n\n"
                        return
                    yield ": still here\n\n"

    async def _still_signed_in(self, viewer: Viewer) -> bool:
        if viewer.open_server:
            return True
        return await self.kit.sessions.is_live(viewer.session)
