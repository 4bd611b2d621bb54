"""Relaying a running turn's chunks to callers waiting on it, possibly in another process.

A turn run by the worker pool produces its model chunks in the worker; a caller streaming that
turn (``send_stream`` on a queued agent, or the HTTP server) waits in another task, often in
another process. The worker *publishes* each chunk through the store only when the turn asks
for it (``TurnInput.relay``, set by a streaming caller), and the caller *subscribes* before the
turn exists, so no chunk can slip past it.

Chunks are a courtesy, not the record: the settled turn, read from the store, is the answer.
A chunk lost on the way (a dropped LISTEN connection, a caller that polls instead of being
notified) costs a progress update, never a result.

:class:`ChunkBroker` is the in-process fan-out every store uses to hand chunks to local
subscribers; a PostgreSQL store feeds it from ``NOTIFY`` so subscribers in any process see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["ChunkBroker", "ChunkSubscription"]

logger = logging.getLogger("turnstile.relay")

#: How many undelivered chunks a slow subscriber may hold before newer ones are dropped.
MAX_BUFFERED_CHUNKS = 10_000


class ChunkSubscription:
    """The chunks of one turn, in the order they were published."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_BUFFERED_CHUNKS)

    def put(self, chunk: dict[str, Any]) -> None:
        """Queue one chunk (wire form ``{"modelChunk": ...}``)."""
        try:
            self._queue.put_nowait(chunk)
        except asyncio.QueueFull:
            # Progress, not the record: the settled turn still holds everything.
            logger.warning("turn %s: a chunk dropped (the stream fell behind)", self.turn_id)

    async def get(self) -> dict[str, Any]:
        """The next chunk, waiting for it."""
        return await self._queue.get()

    def drain(self) -> list[dict[str, Any]]:
        """Every chunk already delivered, without waiting."""
        chunks: list[dict[str, Any]] = []
        while not self._queue.empty():
            chunks.append(self._queue.get_nowait())
        return chunks


class ChunkBroker:
    """In-process fan-out of published chunks to the subscribers of their turn."""

    def __init__(self) -> None:
        self._subscribers: dict[str, list[ChunkSubscription]] = {}

    @property
    def has_subscribers(self) -> bool:
        """Whether anybody in this process is waiting for chunks."""
        return bool(self._subscribers)

    def deliver(self, turn_id: str, chunk: dict[str, Any]) -> None:
        """Hand ``chunk`` to every local subscriber of ``turn_id`` (none: dropped)."""
        for subscription in self._subscribers.get(turn_id, ()):
            subscription.put(chunk)

    @contextlib.asynccontextmanager
    async def subscribe(self, turn_id: str) -> AsyncIterator[ChunkSubscription]:
        """Receive ``turn_id``'s chunks while the block runs."""
        subscription = ChunkSubscription(turn_id)
        self._subscribers.setdefault(turn_id, []).append(subscription)
        try:
            yield subscription
        finally:
            remaining = self._subscribers.get(turn_id, [])
            with contextlib.suppress(ValueError):
                remaining.remove(subscription)
            if not remaining:
                self._subscribers.pop(turn_id, None)
