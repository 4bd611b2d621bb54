"""Server and workers in different processes: chunks relayed, turns surviving a killed worker.

``turnstile serve`` (no embedded workers) enqueues; ``turnstile worker`` processes run the
turns and publish their chunks through PostgreSQL NOTIFY; the server streams them to the
client. Workers are SIGKILLed mid-turn; a replacement continues from the journal.
"""

from __future__ import annotations

import contextlib

import sqlalchemy as sa

from engine import FinishReason, TurnStatus
from engine.remote.client import remote_agent
from tests.databases import postgres_url
from tests.http_support import serve_process, worker_process

#: Short leases so a killed worker's turn is picked up again within seconds.
FAST_RECOVERY = {"TURNSTILE_LEASE_SECONDS": "1.5"}
SLOW_TEXT = "slow one two three four five six seven"


def _attempts(url: str, snapshot_id: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            query = sa.text("SELECT attempts FROM turns WHERE id = :id")
            return int(connection.execute(query, {"id": snapshot_id}).scalar_one())
    finally:
        engine.dispose()


async def test_chunks_from_a_worker_process_reach_the_streaming_client() -> None:
    """A turn run in a separate worker process streams its word chunks to the client."""
    with (
        postgres_url() as url,
        serve_process(url) as (base, _server),
        worker_process(url),
    ):
        async with remote_agent(f"{base}/api/bankingAgent") as agent:
            turn = agent.chat().send_stream("hello relayed world")
            chunks = [chunk.text async for chunk in turn.stream]
            response = await turn.response
    assert chunks == ["Echo: ", "hello ", "relayed ", "world"]
    assert response.text == "Echo: hello relayed world"


async def test_stream_survives_its_worker_being_killed_mid_turn() -> None:
    """SIGKILL the worker mid-stream: a new worker reruns the round and the stream still ends
    with the settled result (chunks of the lost attempt were already sent; the result is the
    record)."""
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(postgres_url())
        base, _server = stack.enter_context(serve_process(url, env=FAST_RECOVERY))
        first = stack.enter_context(worker_process(url, env=FAST_RECOVERY))
        async with remote_agent(f"{base}/api/bankingAgent") as agent:
            turn = agent.chat().send_stream(SLOW_TEXT)
            chunks: list[str] = []
            async for chunk in turn.stream:
                chunks.append(chunk.text)
                if len(chunks) == 2:
                    first.kill()
                    stack.enter_context(worker_process(url, env=FAST_RECOVERY))
            response = await turn.response
        assert response.text == f"Echo: {SLOW_TEXT}"
        assert response.status is TurnStatus.COMPLETED
        assert response.snapshot_id is not None
        assert _attempts(url, response.snapshot_id) == 2
        # The second attempt streamed the whole answer again, after the first one's start.
        assert "".join(chunks).endswith(f"Echo: {SLOW_TEXT}")


async def test_a_client_that_comes_back_after_the_worker_was_replaced_gets_the_result() -> None:
    """Detach, lose the worker, start another: waiting on the snapshot later yields the reply."""
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(postgres_url())
        base, _server = stack.enter_context(serve_process(url, env=FAST_RECOVERY))
        first = stack.enter_context(worker_process(url, env=FAST_RECOVERY))
        async with remote_agent(f"{base}/api/bankingAgent") as agent:
            chat = agent.chat()
            pending = await chat.send(SLOW_TEXT, wait=False)
            assert pending.status is TurnStatus.PENDING
            assert pending.finish_reason is FinishReason.DETACHED
            snapshot_id = chat.pending_snapshot_id
            assert snapshot_id is not None
        # The client is gone; the worker dies while running the turn.
        running = await _wait_claimed(url, snapshot_id)
        assert running
        first.kill()
        stack.enter_context(worker_process(url, env=FAST_RECOVERY))
        async with remote_agent(f"{base}/api/bankingAgent") as returning:
            settled = await returning.wait(snapshot_id, timeout=30)
    assert settled.text == f"Echo: {SLOW_TEXT}"
    assert settled.status is TurnStatus.COMPLETED


async def _wait_claimed(url: str, snapshot_id: str) -> bool:
    import asyncio

    engine = sa.create_engine(url)
    try:
        for _ in range(100):
            with engine.connect() as connection:
                owner = connection.execute(
                    sa.text("SELECT lease_owner FROM turns WHERE id = :id"), {"id": snapshot_id}
                ).scalar_one()
            if owner is not None:
                return True
            await asyncio.sleep(0.05)
        return False
    finally:
        engine.dispose()
