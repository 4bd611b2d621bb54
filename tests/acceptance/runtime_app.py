"""The app of the runtime-limits acceptance tests, loaded by ``turnstile serve`` / ``worker``.

One durable agent, ``runtimeAgent``, on ``TURNSTILE_DATABASE_URL``:

* a message starting with ``block once`` asks for ``blockOnce`` (declared not idempotent), one
  starting with ``block`` for ``block`` (idempotent): synchronous tools that sleep
  ``RUNTIME_BLOCK_SECONDS`` in their thread and log ``start``/``end`` with their idempotency
  key to ``RUNTIME_TOOL_LOG``;
* anything else goes to the scripted model: an echo streamed word by word (each word
  ``RUNTIME_SLOW_CHUNK`` seconds apart when the message contains ``slow``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from engine import Engine, ScriptedModel, ToolContext
from engine.conversation.parts import Message, Part
from engine.model import ChunkSink, ModelRequest, ModelResponse
from stores import SqlSessionStore, default_url

__all__ = ["ai"]


class RuntimeModel:
    """Requests a blocking tool for ``block`` messages; echoes everything else."""

    def __init__(self) -> None:
        delay = float(os.environ.get("RUNTIME_SLOW_CHUNK") or 0.2)
        self._echo = ScriptedModel(slow_chunk_delay=delay)

    @property
    def name(self) -> str:
        """The model's name in logs."""
        return "runtime-test"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """A tool request, the answer after it, or the scripted echo."""
        last = request.messages[-1]
        if last.role == "tool":
            return ModelResponse(message=Message(role="model", content=[Part.of_text("Done.")]))
        text = last.text
        if text.startswith("block"):
            tool = "blockOnce" if text.startswith("block once") else "block"
            call = Part.of_request(tool, "block-1", {})
            return ModelResponse(message=Message(role="model", content=[call]))
        return await self._echo.generate(request, on_chunk)


def _log(event: str, key: str) -> None:
    path = os.environ.get("RUNTIME_TOOL_LOG")
    if path:
        with Path(path).open("a") as log:
            log.write(f"{event} {key}\n")


def block(_input: Any, ctx: ToolContext) -> dict[str, float]:
    """Hold this thread for ``RUNTIME_BLOCK_SECONDS``, as a synchronous client call would."""
    seconds = float(os.environ.get("RUNTIME_BLOCK_SECONDS") or 0)
    _log("start", ctx.idempotency_key)
    time.sleep(seconds)
    _log("end", ctx.idempotency_key)
    return {"slept": seconds}


ai = Engine(model=RuntimeModel(), state_keys={"runtime-tests": "runtime-tests-only-not-a-secret"})
ai.define_agent(
    name="runtimeAgent",
    tools=[
        ai.define_tool(name="block", fn=block),
        ai.define_tool(name="blockOnce", fn=block, idempotent=False),
    ],
    store=SqlSessionStore(default_url()),
)
