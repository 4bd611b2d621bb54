"""A worker process that configures tracing from its ``OTEL_*`` environment (through the
settings), as
``turnstile worker`` does, and runs one queued turn of the ``echo`` agent.

``python -m tests.acceptance.traced_worker DATABASE_URL TURN_ID`` runs a worker pool on the
database until the turn settles, flushes its spans to the configured exporters and writes
``{"configured": ..., "text": ...}`` on its standard error (standard output is the console
exporter's).
"""

from __future__ import annotations

import asyncio
import json
import sys

from opentelemetry import trace

from engine import Agent, Engine, ScriptedModel
from engine.telemetry import tracing
from stores import SqlSessionStore
from stores.settings import current_settings
from tests.conftest import TEST_STATE_KEYS
from workers import WorkerPool

AGENT = "echo"


def echo_agent(store: SqlSessionStore) -> tuple[Engine, Agent]:
    """The app: one queued agent on ``store`` answering with the scripted model."""
    ai = Engine(model=ScriptedModel(), state_keys=TEST_STATE_KEYS)
    return ai, ai.define_agent(name=AGENT, store=store, execution="workers")


async def run(url: str, turn_id: str) -> dict[str, object]:
    configured = tracing.configure_tracing(current_settings().tracing_config())
    store = SqlSessionStore(url)
    try:
        ai, agent = echo_agent(store)
        async with WorkerPool(ai, store, concurrency=1, poll_interval=0.05, scheduler=False):
            answer = await agent.wait(turn_id, timeout=30)
    finally:
        await store.close()
    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if shutdown is not None:
        shutdown()  # exports what the batch processors still hold
    return {"configured": configured, "text": answer.text}


if __name__ == "__main__":
    result = asyncio.run(run(sys.argv[1], sys.argv[2]))
    print(json.dumps(result), file=sys.stderr)
