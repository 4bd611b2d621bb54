"""The app ``turnstile serve`` runs for the genuine-client tests of custom state and artifacts.

``turnstile serve --app tests.acceptance.state_app:ai`` loads :data:`ai`, built on first access
from ``TURNSTILE_DATABASE_URL`` (the CLI exports it before the import). Each agent's model asks
for its one tool once, then answers ``done``; the tools are where the state changes, as the
custom agents of Genkit's conformance spec (``tests/specs/agent.yaml``) change it:

* ``counterAgent`` (server-managed) and ``counterAgentStateless`` (client-managed): the tool
  adds one to ``custom.counter`` and adds the artifact ``doc<counter>``;
* ``multiStateAgent`` (server-managed): three changes of the custom state in one call, and
  ``doc1`` added twice (the second replaces the first) then ``doc2``;
* ``bigStateAgent`` (server-managed): a custom state too large for one relayed notification,
  then a small change to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine import Engine, ToolContext
from engine.conversation.parts import Message, Part
from engine.model import ChunkSink, ModelRequest, ModelResponse
from engine.store import SessionStore
from stores import SqlSessionStore
from stores.settings import current_settings

__all__ = ["build"]


class OneToolModel:
    """Asks for the request's first tool after a user message; says ``done`` after a tool."""

    name = "one-tool"

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        """The next step, read from the conversation's last message."""
        if request.messages[-1].role == "user":
            part = Part.of_request(request.tools[0].name, None, {})
        else:
            part = Part.of_text("done")
        if on_chunk is not None:
            await on_chunk([part])
        return ModelResponse(message=Message(role="model", content=[part]))


def _count(_: Any, ctx: ToolContext) -> int:
    custom = ctx.update_state(lambda s: {**(s or {}), "counter": (s or {}).get("counter", 0) + 1})
    number = custom["counter"]
    ctx.add_artifact({"name": f"doc{number}", "parts": [{"text": f"content{number}"}]})
    return int(number)


def _three_changes(_: Any, ctx: ToolContext) -> str:
    ctx.update_state(lambda s: {**(s or {}), "counter": 1, "status": "working"})
    ctx.update_state(lambda s: {**s, "counter": 2})
    ctx.update_state(lambda s: {**s, "status": "done"})
    ctx.add_artifact({"name": "doc1", "parts": [{"text": "v1"}]})
    ctx.add_artifact({"name": "doc1", "parts": [{"text": "v2"}]})
    ctx.add_artifact({"name": "doc2", "parts": [{"text": "other"}]})
    return "changed"


#: Larger than a NOTIFY payload (8,000 bytes): its patch cannot be relayed from the worker.
BIG_DRAFT = "draft " * 3000


def _big_state(_: Any, ctx: ToolContext) -> str:
    ctx.update_state({"draft": BIG_DRAFT, "n": 1})
    ctx.update_state(lambda s: {**s, "n": 2})
    return "drafted"


def build(store: SessionStore, state_keys: Mapping[str, str] | None = None) -> Engine:
    """The engine with its agents, the server-managed ones on ``store``."""
    ai = Engine(model=OneToolModel(), state_keys=state_keys)
    count = ai.define_tool(name="count", fn=_count)
    three = ai.define_tool(name="threeChanges", fn=_three_changes)
    ai.define_agent(name="counterAgent", tools=[count], store=store)
    ai.define_agent(name="counterAgentStateless", tools=[count])
    ai.define_agent(name="multiStateAgent", tools=[three], store=store)
    big = ai.define_tool(name="bigState", fn=_big_state)
    ai.define_agent(name="bigStateAgent", tools=[big], store=store)
    return ai


_built: dict[str, Engine] = {}


def __getattr__(name: str) -> Any:
    # Built on first access (PEP 562), so importing this module builds nothing.
    if name == "ai":
        if "ai" not in _built:
            # The process's settings carry the signing keys, as `turnstile serve` hands them.
            settings = current_settings()
            _built["ai"] = build(
                SqlSessionStore(settings.database_url), state_keys=settings.state_keys
            )
        return _built["ai"]
    raise AttributeError(name)
