"""What a turn costs and holds at run time, with real `turnstile serve` and `worker` processes.

* Chunks are relayed only to a client that streams, in batches: far fewer notifications (and
  transactions) than chunks, complete and in order.
* A streaming client that disconnects aborts its turn, and the worker's slot is free at once.
* A synchronous tool does not keep a stopping worker past its grace period; the turn is handed
  back and recovered from its journal (re-run under the same key, or asked about).
* A remote ``send(timeout=)`` with no worker running ends with a typed error and leaves the
  turn pending for a later wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from engine import FinishReason, TurnStatus
from engine.errors import TurnTimeoutError
from engine.remote.client import remote_agent
from stores.notify import CHUNK_CHANNEL
from tests.databases import libpq_dsn, postgres_url
from tests.http_support import ROOT, serve_process

APP = "tests.acceptance.runtime_app:ai"
AGENT = "runtimeAgent"
#: How long the worker may take to exit past its grace period (the pool's margin is 5 s;
#: process start-up and teardown take the rest).
EXIT_SLACK = 4.0


@contextlib.contextmanager
def worker(
    url: str, log: Path, *, grace: float = 10.0, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``turnstile worker`` for the runtime app, one slot, its output in ``log``."""
    environment = {**os.environ, "TURNSTILE_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    environment.update(env or {})
    command = [
        sys.executable,
        "-m",
        "workers.cli",
        "worker",
        "--app",
        APP,
        "--db",
        url,
        "--concurrency",
        "1",
        "--poll-interval",
        "0.2",
        "--shutdown-grace",
        str(grace),
        "--log-level",
        "INFO",
    ]
    with log.open("ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=out, stderr=out)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(timeout=15)


def query(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of one statement on the test's own connection."""
    with psycopg.connect(libpq_dsn(url), autocommit=True) as connection:
        return connection.execute(sql, params).fetchall()


async def eventually(check: Any, *, timeout: float, what: str) -> Any:
    """Poll ``check()`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def chunk_notifications(url: str) -> AsyncIterator[list[str]]:
    """Every payload sent on the chunk channel while the block runs."""
    received: list[str] = []
    async with await psycopg.AsyncConnection.connect(libpq_dsn(url), autocommit=True) as connection:
        await connection.execute(f"LISTEN {CHUNK_CHANNEL}")

        async def collect() -> None:
            async for note in connection.notifies():
                received.append(note.payload)

        collector = asyncio.create_task(collect())
        try:
            yield received
        finally:
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector


def turn_body(text: str) -> dict[str, Any]:
    """A turn request starting a new session with one user message."""
    return {"data": {"message": {"role": "user", "content": [{"text": text}]}}}


def parse_frames(text: str) -> list[dict[str, Any]]:
    """The JSON of a streamed reply's ``data:`` frames."""
    return [
        json.loads(raw.removeprefix("data: "))
        for raw in text.split("\n\n")
        if raw.startswith("data: ")
    ]


def chunk_texts(frames: list[dict[str, Any]]) -> list[str]:
    """The texts of the model's chunks among ``frames``."""
    texts = []
    for frame in frames:
        body = frame.get("message", {}).get("modelChunk")
        if body is not None and body.get("role") == "model":
            texts.append("".join(part.get("text", "") for part in body["content"]))
    return texts


async def test_only_a_streaming_client_gets_chunks_and_they_travel_in_batches(
    tmp_path: Path,
) -> None:
    """A non-streaming request publishes no chunk; a streamed 2,000-word echo arrives whole
    and in order, with at most one notification per 20 chunks."""
    words = " ".join(f"word{i}" for i in range(2000))
    with (
        postgres_url() as url,
        serve_process(url, app=APP) as (base, _server),
        worker(url, tmp_path / "worker.log"),
    ):
        async with chunk_notifications(url) as notes, httpx.AsyncClient(timeout=60) as http:
            plain = await http.post(f"{base}/api/{AGENT}", json=turn_body(words))
            assert plain.status_code == 200, plain.text
            answer = plain.json()["result"]["message"]["content"][0]["text"]
            assert answer == f"Echo: {words}"
            await asyncio.sleep(0.5)  # anything published would have arrived by now
            assert notes == []

            streamed = await http.post(
                f"{base}/api/{AGENT}",
                json=turn_body(words),
                headers={"accept": "text/event-stream"},
            )
            texts = chunk_texts(parse_frames(streamed.text))
            await asyncio.sleep(0.2)
    assert "".join(texts) == f"Echo: {words}"
    assert len(texts) == 2001
    assert 0 < len(notes) <= len(texts) // 20, len(notes)


async def test_a_streaming_client_that_disconnects_aborts_its_turn(tmp_path: Path) -> None:
    """Close the connection after three chunks of a slow turn: the turn settles ``aborted``
    within seconds, and the worker's only slot serves the next turn at once."""
    slow = "slow " + " ".join(f"w{i}" for i in range(200))  # 40 s at 0.2 s a word
    with (
        postgres_url() as url,
        serve_process(url, app=APP) as (base, _server),
        worker(url, tmp_path / "worker.log"),
    ):
        async with httpx.AsyncClient(timeout=60) as http:
            seen = 0
            async with http.stream(
                "POST",
                f"{base}/api/{AGENT}",
                json=turn_body(slow),
                headers={"accept": "text/event-stream"},
            ) as reply:
                async for line in reply.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen == 3:
                        break
        disconnected = time.monotonic()
        [(turn_id,)] = query(url, "SELECT id FROM turns")
        status = await eventually(
            lambda: query(
                url, "SELECT status FROM turns WHERE id = %s AND status = 'aborted'", turn_id
            ),
            timeout=10,
            what="the abandoned turn to settle aborted",
        )
        assert status == [("aborted",)]
        assert time.monotonic() - disconnected < 10
        # The slot is free: a new turn on the one-slot worker is answered at once.
        async with httpx.AsyncClient(timeout=10) as http:
            quick = await http.post(f"{base}/api/{AGENT}", json=turn_body("quick one"))
        assert quick.json()["result"]["finishReason"] == "stop"


@pytest.mark.parametrize("tool", ["block", "block once"])
async def test_a_worker_stops_within_its_grace_while_a_synchronous_tool_runs(
    tmp_path: Path, tool: str
) -> None:
    """SIGTERM while a tool sleeps 60 s in its thread, with a 1 s grace: the worker exits
    within the grace period plus the margin, the call stays journaled ``running`` and the
    turn is handed back. Another worker then re-runs the idempotent tool under the same
    key, or — for the one declared not idempotent — pauses the turn to ask about it."""
    tool_log = tmp_path / "tools.log"
    env = {"RUNTIME_TOOL_LOG": str(tool_log)}
    with postgres_url() as url, serve_process(url, app=APP) as (base, _server):
        async with remote_agent(f"{base}/api/{AGENT}") as agent:
            chat = agent.chat()
            await chat.send(tool, wait=False)
            turn_id = chat.pending_snapshot_id
            assert turn_id is not None
            with worker(
                url,
                tmp_path / "first.log",
                grace=1.0,
                env={**env, "RUNTIME_BLOCK_SECONDS": "60"},
            ) as first:
                await eventually(
                    lambda: tool_log.exists() and tool_log.read_text(),
                    timeout=30,
                    what="the tool to start",
                )
                stopping = time.monotonic()
                first.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(first.wait, 20)
                took = time.monotonic() - stopping
            assert code == 0, (tmp_path / "first.log").read_text()
            assert took < 1.0 + 5.0 + EXIT_SLACK, took
            assert query(url, "SELECT status, lease_owner FROM turns") == [("pending", None)]
            assert query(url, "SELECT status FROM tool_calls") == [("running",)]
            [key] = {line.split()[1] for line in tool_log.read_text().splitlines()}

            with worker(url, tmp_path / "second.log", env={**env, "RUNTIME_BLOCK_SECONDS": "0"}):
                settled = await chat.wait(timeout=30)
    starts = [line for line in tool_log.read_text().splitlines() if line.startswith("start")]
    if tool == "block":
        assert settled.status is TurnStatus.COMPLETED
        assert starts == [f"start {key}", f"start {key}"]  # once per worker, one key
    else:
        assert settled.finish_reason is FinishReason.INTERRUPTED
        [paused] = settled.interrupts
        assert paused.metadata["unfinished"] is True
        assert starts == [f"start {key}"]  # not run again without asking


async def test_a_remote_send_with_a_timeout_leaves_the_turn_pending(tmp_path: Path) -> None:
    """No worker: ``send(timeout=1)`` raises the typed timeout naming the pending snapshot;
    once a worker runs, waiting again returns the answer."""
    with postgres_url() as url, serve_process(url, app=APP) as (base, _server):
        async with remote_agent(f"{base}/api/{AGENT}") as agent:
            chat = agent.chat()
            started = time.monotonic()
            with pytest.raises(TurnTimeoutError) as expired:
                await chat.send("hello later", timeout=1.0)
            assert time.monotonic() - started < 5
            assert expired.value.status == "DEADLINE_EXCEEDED"
            assert expired.value.snapshot_id == chat.pending_snapshot_id
            assert query(url, "SELECT status, attempts FROM turns") == [("pending", 0)]
            with worker(url, tmp_path / "worker.log"):
                settled = await chat.wait(timeout=30)
    assert settled.text == "Echo: hello later"
