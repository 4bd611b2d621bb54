"""Publishing a running turn's chunks in batches: one transaction carries many chunks.

A model streams hundreds or thousands of small deltas. Sent one ``NOTIFY`` each, a stream cost
one transaction per delta; here a turn's chunks wait in a buffer and leave together — after
:data:`RELAY_INTERVAL` seconds, or as soon as :data:`RELAY_BATCH_BYTES` of them are waiting —
packed into as few payloads as NOTIFY's size limit allows, all sent in one transaction.

Order is kept: a turn's batches are sent one after the other, each taking everything buffered
when it starts. :meth:`ChunkBatcher.flush` sends what is left and waits for every batch in
flight, and the store calls it before a turn's status changes, so the last chunks are
committed — and delivered to listeners, which PostgreSQL does in commit order — before the
notification that the turn settled: a subscriber never misses the tail.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from engine.telemetry import instruments

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "RELAY_BATCH_BYTES",
    "RELAY_INTERVAL",
    "ChunkBatcher",
    "pack_chunks",
    "read_chunk_payload",
]

logger = logging.getLogger("turnstile.notify")

#: NOTIFY payloads must stay under 8,000 bytes; keep a margin for the envelope.
MAX_PAYLOAD_BYTES = 7_000
#: The longest a chunk waits in the buffer before it is published.
RELAY_INTERVAL = 0.05
#: Buffered chunks (as JSON) past which a batch leaves at once, without waiting for the
#: interval; the producer then waits for that batch, so a fast model cannot outrun the relay.
RELAY_BATCH_BYTES = 8 * MAX_PAYLOAD_BYTES

#: Sends one batch of payloads in one transaction.
BatchSender = Callable[[list[str]], Awaitable[None]]


def _json(value: Any) -> str:
    # ASCII-only (escapes for the rest), so a payload's length in characters is its size in
    # bytes.
    return json.dumps(value, separators=(",", ":"))


def _split_text(turn_id: str, chunk: dict[str, Any], budget: int) -> list[str]:
    """A chunk too large for one payload as several smaller ones: a text delta is cut into
    deltas whose texts concatenate to it; anything else (e.g. a tool request with a big
    input) cannot be cut and is not relayed — the settled turn still holds it."""
    body = chunk.get("modelChunk") or {}
    content = body.get("content") or []
    if not content or any(set(part) != {"text"} for part in content):
        logger.warning("a chunk of turn %s is too large to relay; left out", turn_id)
        return []
    text = "".join(str(part["text"]) for part in content)
    overhead = len(_json({"modelChunk": {**body, "content": [{"text": ""}]}}))
    # A character takes at most 12 bytes escaped (a surrogate pair), so this many always fit.
    step = max(1, (budget - overhead) // 12)
    return [
        _json({"modelChunk": {**body, "content": [{"text": text[i : i + step]}]}})
        for i in range(0, len(text), step)
    ]


def pack_chunks(
    turn_id: str, chunks: Sequence[dict[str, Any]], numbers: Iterator[int]
) -> list[str]:
    """``chunks`` (wire form, in order) as few NOTIFY payloads as fit under
    :data:`MAX_PAYLOAD_BYTES`: ``{"t": turn id, "n": number, "c": [chunk, ...]}``.

    ``n`` makes every payload distinct: PostgreSQL delivers identical notifications of one
    transaction once, and two batches of the same words would be identical.
    """
    payloads: list[str] = []
    head = f'{{"t":{_json(turn_id)},"n":'
    # The envelope around the chunks, with room for the number's digits.
    budget = MAX_PAYLOAD_BYTES - len(head) - 20 - len(',"c":[]}')
    batch: list[str] = []
    size = 0

    def close() -> None:
        nonlocal batch, size
        if batch:
            payloads.append(f'{head}{next(numbers)},"c":[{",".join(batch)}]}}')
            batch, size = [], 0

    for chunk in chunks:
        encoded = _json(chunk)
        pieces = [encoded] if len(encoded) <= budget else _split_text(turn_id, chunk, budget)
        for piece in pieces:
            if len(piece) > budget:  # metadata alone past the limit: NOTIFY would refuse it
                logger.warning("a chunk of turn %s is too large to relay; left out", turn_id)
                break
            if size + len(piece) + 1 > budget:
                close()
            batch.append(piece)
            size += len(piece) + 1
    close()
    return payloads


def read_chunk_payload(payload: str) -> tuple[str, list[dict[str, Any]]]:
    """The turn id and the chunks of a payload (also the one-chunk form ``"c": {...}`` that
    earlier versions sent, so a rolling upgrade keeps relaying). Raises ``ValueError``,
    ``KeyError`` or ``TypeError`` when it is malformed."""
    note = json.loads(payload)
    body = note["c"]
    chunks = body if isinstance(body, list) else [body]
    return str(note["t"]), [dict(chunk) for chunk in chunks]


class _Buffer:
    """One turn's chunks waiting to be published, and the lock that orders its batches."""

    def __init__(self) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.size = 0
        self.timer: asyncio.TimerHandle | None = None
        self.lock = asyncio.Lock()


class ChunkBatcher:
    """Buffers each turn's chunks and publishes them in batches through ``send``."""

    def __init__(
        self,
        send: BatchSender,
        *,
        interval: float = RELAY_INTERVAL,
        batch_bytes: int = RELAY_BATCH_BYTES,
    ) -> None:
        self._send = send
        #: Seconds a chunk may wait before its batch leaves.
        self.interval = interval
        #: Buffered size past which a batch leaves at once.
        self.batch_bytes = batch_bytes
        self._buffers: dict[str, _Buffer] = {}
        self._numbers = itertools.count()
        #: Flushes started by a timer: referenced until done (the loop keeps weak ones).
        self._timed: set[asyncio.Task[None]] = set()
        #: Batches sent and payloads in them since the store was made (what a test or an
        #: operator can compare with the chunks relayed).
        self.batches_sent = 0
        self.payloads_sent = 0

    def holds(self, turn_id: str) -> bool:
        """Whether chunks of ``turn_id`` are buffered or being sent."""
        return turn_id in self._buffers

    async def publish(self, turn_id: str, chunk: dict[str, Any]) -> None:
        """Buffer ``chunk``; it leaves with the turn's next batch. Waits only when the buffer
        is full, for the batch that empties it."""
        buffer = self._buffers.get(turn_id)
        if buffer is None:
            buffer = self._buffers[turn_id] = _Buffer()
        buffer.chunks.append(chunk)
        # The text's length stands for the chunk's: packing measures it exactly later.
        buffer.size += 64 + sum(len(str(part)) for part in _content(chunk))
        if buffer.size >= self.batch_bytes:
            await self.flush(turn_id)
        elif buffer.timer is None:
            buffer.timer = asyncio.get_running_loop().call_later(
                self.interval, self._flush_soon, turn_id
            )

    def _flush_soon(self, turn_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self.flush(turn_id))
        self._timed.add(task)
        task.add_done_callback(self._timed.discard)

    async def flush(self, turn_id: str) -> None:
        """Publish what is buffered for ``turn_id`` and return once every batch of it
        started so far was sent (or failed: chunks are progress, a failure only logs)."""
        buffer = self._buffers.get(turn_id)
        if buffer is None:
            return
        async with buffer.lock:
            if buffer.timer is not None:
                buffer.timer.cancel()
                buffer.timer = None
            chunks, buffer.chunks, buffer.size = buffer.chunks, [], 0
            if chunks:
                await self._send_batch(turn_id, chunks)
            if not buffer.chunks and self._buffers.get(turn_id) is buffer:
                del self._buffers[turn_id]

    async def _send_batch(self, turn_id: str, chunks: list[dict[str, Any]]) -> None:
        payloads = pack_chunks(turn_id, chunks, self._numbers)
        if not payloads:
            return
        try:
            await self._send(payloads)
        except Exception as exc:  # progress, not the record: the settled turn has it all
            logger.warning("turn %s: %d chunk(s) not relayed (%s)", turn_id, len(chunks), exc)
            return
        self.batches_sent += 1
        self.payloads_sent += len(payloads)
        instruments.chunks_relayed(len(chunks), 1)

    async def flush_all(self) -> None:
        """Publish everything buffered (before the store closes)."""
        for turn_id in list(self._buffers):
            await self.flush(turn_id)


def _content(chunk: dict[str, Any]) -> list[Any]:
    body = chunk.get("modelChunk")
    content = body.get("content") if isinstance(body, dict) else None
    return content if isinstance(content, list) else [chunk]
