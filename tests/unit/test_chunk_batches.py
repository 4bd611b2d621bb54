"""Packing relayed chunks into NOTIFY payloads, and batching them per turn.

The sender here is a plain coroutine that records what it is given: these tests are about
what leaves together and in what order (the PostgreSQL side is in the integration and
acceptance tiers).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from stores.chunk_relay import MAX_PAYLOAD_BYTES, ChunkBatcher, pack_chunks, read_chunk_payload


def text_chunk(text: str, index: int = 0) -> dict[str, Any]:
    """A model text delta in wire form."""
    return {"modelChunk": {"role": "model", "index": index, "content": [{"text": text}]}}


def unpack(payloads: list[str]) -> list[dict[str, Any]]:
    """Every chunk of ``payloads``, in order (and each payload within the size limit)."""
    chunks = []
    for payload in payloads:
        assert len(payload.encode()) <= MAX_PAYLOAD_BYTES
        _turn, inside = read_chunk_payload(payload)
        chunks.extend(inside)
    return chunks


def test_many_small_chunks_share_payloads_in_order() -> None:
    """3,000 word deltas fit in a few dozen payloads and come out as they went in."""
    chunks = [text_chunk(f"word{i} ") for i in range(3000)]
    payloads = pack_chunks("turn-1", chunks, itertools.count())
    assert len(payloads) <= 3000 // 50
    assert unpack(payloads) == chunks


def test_identical_batches_are_still_distinct_payloads() -> None:
    """PostgreSQL delivers identical notifications of one transaction once: the number in
    each payload keeps repeated text apart."""
    payloads = pack_chunks("turn-1", [text_chunk("ha " * 1000)] * 8, itertools.count())
    assert len(payloads) == len(set(payloads)) > 1
    assert "".join(c["modelChunk"]["content"][0]["text"] for c in unpack(payloads)) == (
        "ha " * 8000
    )


def test_a_long_text_is_cut_and_a_long_tool_request_left_out() -> None:
    """A text delta larger than a payload is cut into deltas of the same message (whatever
    its characters escape to); a tool request that large cannot be cut and is not relayed."""
    text = "é😀x" * 5000
    [only] = [text_chunk(text, index=2)]
    pieces = unpack(pack_chunks("turn-1", [only], itertools.count()))
    assert len(pieces) > 1
    assert {p["modelChunk"]["index"] for p in pieces} == {2}
    assert "".join(p["modelChunk"]["content"][0]["text"] for p in pieces) == text
    huge_request = {
        "modelChunk": {
            "role": "model",
            "index": 0,
            "content": [{"toolRequest": {"name": "t", "input": {"x": "y" * 10_000}}}],
        }
    }
    assert pack_chunks("turn-1", [huge_request], itertools.count()) == []


def test_payloads_of_earlier_versions_are_read() -> None:
    """A one-chunk payload ``{"t", "c": {...}}`` (before batching) still relays."""
    chunk = text_chunk("old")
    assert read_chunk_payload(json.dumps({"t": "turn-1", "c": chunk})) == ("turn-1", [chunk])


class Sent:
    """Records each batch handed to it; can hold a batch back until released."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, payloads: list[str]) -> None:
        await self.gate.wait()
        self.batches.append(unpack(payloads))


async def test_chunks_leave_together_after_the_interval() -> None:
    """Chunks published within the interval leave as one batch, without a flush."""
    sent = Sent()
    batcher = ChunkBatcher(sent, interval=0.05)
    for i in range(100):
        await batcher.publish("turn-1", text_chunk(f"{i} "))
    assert sent.batches == []
    await asyncio.sleep(0.2)
    assert len(sent.batches) == 1 and len(sent.batches[0]) == 100
    assert not batcher.holds("turn-1")


async def test_a_full_buffer_leaves_at_once_and_holds_the_producer() -> None:
    """Past ``batch_bytes`` the publishing call itself sends the batch."""
    sent = Sent()
    batcher = ChunkBatcher(sent, interval=60, batch_bytes=2_000)
    for i in range(200):
        await batcher.publish("turn-1", text_chunk(f"word{i} "))
    assert len(sent.batches) >= 5
    await batcher.flush("turn-1")
    assert [c for batch in sent.batches for c in batch] == [
        text_chunk(f"word{i} ") for i in range(200)
    ]


async def test_a_flush_waits_for_the_batch_in_flight_and_keeps_the_order() -> None:
    """While a batch is being sent, later chunks wait; a flush (what the store runs before a
    turn's status changes) returns only once both batches are out, the earlier first."""
    sent = Sent()
    batcher = ChunkBatcher(sent, interval=0.01)
    await batcher.publish("turn-1", text_chunk("first "))
    sent.gate.clear()
    await asyncio.sleep(0.05)  # the timed batch has started and is held at the gate
    await batcher.publish("turn-1", text_chunk("second"))
    flushing = asyncio.create_task(batcher.flush("turn-1"))
    await asyncio.sleep(0.05)
    assert not flushing.done()
    sent.gate.set()
    await flushing
    assert sent.batches == [[text_chunk("first ")], [text_chunk("second")]]
    assert not batcher.holds("turn-1")


async def test_a_failed_batch_is_logged_not_raised() -> None:
    """Chunks are progress: a batch that cannot be sent does not fail the turn."""

    async def broken(_payloads: list[str]) -> None:
        raise OSError("database gone")

    batcher = ChunkBatcher(broken, interval=60)
    await batcher.publish("turn-1", text_chunk("lost"))
    await batcher.flush("turn-1")
    assert batcher.batches_sent == 0
