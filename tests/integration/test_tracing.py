"""OpenTelemetry spans of a queued turn, joined to the trace of the request that created it.

A caller creates a turn inside its span and a real worker pool runs it later, on PostgreSQL:
the turn's stored W3C context makes the worker's span of the attempt a child of the caller's,
with the rounds, the model calls (GenAI semantic conventions) and the tool calls below it.
The spans go to an in-memory exporter through a provider given to Turnstile alone
(:func:`engine.telemetry.tracing.use_tracer_provider`), so the test process never installs a global
one: with none installed, nothing is recorded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from engine import Agent, Engine, ToolContext
from engine.model import ChunkSink, ModelRequest, ModelResponse, ModelUsage
from engine.remote.server import create_app
from engine.remote.tracing import request_span_middleware
from engine.telemetry import tracing
from stores import SqlSessionStore
from tests.conftest import TEST_STATE_KEYS
from tests.databases import sql_store
from tests.http_support import serve_in_loop
from tests.support import ask, say
from workers import WorkerPool

MODEL = "acme:reasoner-7"


class LookupModel:
    """Asks for ``lookup`` once, then answers from its output; reports token usage as a
    provider does (a stand-in for the LLM only)."""

    name = MODEL

    async def generate(
        self, request: ModelRequest, on_chunk: ChunkSink | None = None
    ) -> ModelResponse:
        if request.messages[-1].role == "tool":
            return ModelResponse(
                message=say("found"), usage=ModelUsage(input_tokens=40, output_tokens=3)
            )
        return ModelResponse(
            message=ask(("lookup", "q1", {"query": "invoices"})),
            finish_reason="stop",
            usage=ModelUsage(input_tokens=25, output_tokens=9),
        )


@dataclass
class Tracing:
    """The provider Turnstile's spans go to, and what it exported."""

    provider: TracerProvider
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


@pytest.fixture
def traced() -> Iterator[Tracing]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    try:
        yield Tracing(provider, exporter)
    finally:
        tracing.use_tracer_provider(None)
        provider.shutdown()


@pytest.fixture
async def store() -> AsyncIterator[SqlSessionStore]:
    async with sql_store("postgres") as store:
        yield store


@dataclass
class SeenByTool:
    """What the tool saw of the span it ran in."""

    recording: list[bool]
    trace_ids: list[str | None]


def lookup_agent(store: SqlSessionStore) -> tuple[Engine, Agent, SeenByTool]:
    """A queued agent on ``store`` whose tool notes the span it runs in."""
    ai = Engine(model=LookupModel(), state_keys=TEST_STATE_KEYS)
    seen = SeenByTool([], [])

    def lookup(data: Any, ctx: ToolContext) -> dict[str, str]:
        seen.recording.append(trace.get_current_span().is_recording())
        seen.trace_ids.append(tracing.current_trace_id())
        return {"invoice": "INV-7"}

    tool = ai.define_tool(name="lookup", fn=lookup)
    agent = ai.define_agent(name="clerk", tools=[tool], store=store, execution="workers")
    return ai, agent, seen


async def run_queued(ai: Engine, agent: Agent, snapshot_id: str) -> str:
    """Run the queued turn with a worker pool in this process; the answer's text."""
    async with WorkerPool(ai, concurrency=1, poll_interval=0.05, scheduler=False):
        answer = await agent.wait(snapshot_id, timeout=20)
    return answer.text


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return sorted(
        (s for s in spans if s.name == name),
        key=lambda s: s.start_time or 0,
    )


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


async def test_the_worker_spans_join_the_trace_of_the_request_that_queued_the_turn(
    traced: Tracing, store: SqlSessionStore
) -> None:
    """caller → (stored context) → invoke_agent → rounds → chat and execute_tool spans."""
    ai, agent, seen = lookup_agent(store)
    caller = traced.provider.get_tracer("test-caller")
    with caller.start_as_current_span("POST /api/clerk", kind=SpanKind.SERVER) as request:
        sent = await agent.chat().send("Find my invoices.", wait=False)
    request_context = request.get_span_context()
    stored = await store.get_turn(str(sent.snapshot_id))
    assert stored is not None and stored.trace_context is not None
    assert stored.trace_context["traceparent"] == (
        f"00-{request_context.trace_id:032x}-{request_context.span_id:016x}-"
        f"{request_context.trace_flags:02x}"
    )

    assert await run_queued(ai, agent, str(sent.snapshot_id)) == "found"

    spans = traced.spans()
    (caller_span,) = named(spans, "POST /api/clerk")
    (turn,) = named(spans, "invoke_agent clerk")
    rounds = named(spans, "turnstile.round")
    chats = named(spans, "chat reasoner-7")
    (tool,) = named(spans, "execute_tool lookup")
    assert {trace_id(s) for s in spans} == {request_context.trace_id}
    assert parent_of(turn) == span_id(caller_span)
    assert turn.kind is SpanKind.CONSUMER
    assert [r.attributes and r.attributes["turnstile.round"] for r in rounds] == [1, 2]
    assert [parent_of(r) for r in rounds] == [span_id(turn)] * 2
    assert [parent_of(c) for c in chats] == [span_id(r) for r in rounds]
    assert parent_of(tool) == span_id(rounds[0])
    assert len(spans) == 7

    assert dict(turn.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "clerk",
        "gen_ai.conversation.id": stored.session_id,
        "turnstile.turn.id": stored.id,
        "turnstile.turn.kind": "message",
        "turnstile.turn.attempt": 1,
        "turnstile.turn.status": "completed",
        "turnstile.turn.finish_reason": "stop",
    }
    first_chat = dict(chats[0].attributes or {})
    assert first_chat == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "acme",
        "gen_ai.system": "acme",
        "gen_ai.request.model": "reasoner-7",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 25,
        "gen_ai.usage.output_tokens": 9,
    }
    assert chats[0].kind is SpanKind.CLIENT
    assert (chats[1].attributes or {})["gen_ai.usage.input_tokens"] == 40
    assert dict(tool.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": "q1",
        "turnstile.tool.idempotency_key": f"{stored.id}:q1",
        "turnstile.round": 1,
        "turnstile.tool.outcome": "done",
    }
    assert seen.recording == [True]
    assert seen.trace_ids == [f"{request_context.trace_id:032x}"]
    assert all(s.status.status_code is StatusCode.UNSET for s in spans)


async def test_a_turn_created_outside_a_trace_starts_a_new_one(
    traced: Tracing, store: SqlSessionStore
) -> None:
    """No span when the turn was created: nothing is stored, and the worker's span of the
    attempt is the root of a trace of its own (not a child of the pool's surroundings)."""
    ai, agent, _ = lookup_agent(store)
    sent = await agent.chat().send("Find my invoices.", wait=False)
    stored = await store.get_turn(str(sent.snapshot_id))
    assert stored is not None and stored.trace_context is None

    pool_tracer = traced.provider.get_tracer("test-pool-owner")
    with pool_tracer.start_as_current_span("process lifetime"):
        assert await run_queued(ai, agent, str(sent.snapshot_id)) == "found"

    spans = traced.spans()
    (turn,) = named(spans, "invoke_agent clerk")
    assert turn.parent is None
    below = [s for s in spans if s.name not in ("invoke_agent clerk", "process lifetime")]
    assert len(below) == 5
    assert {trace_id(s) for s in below} == {trace_id(turn)}
    (lifetime,) = named(spans, "process lifetime")
    assert trace_id(lifetime) != trace_id(turn)


async def test_a_failed_tool_marks_its_span_and_the_attempt_as_errors(
    traced: Tracing, store: SqlSessionStore
) -> None:
    """A tool that raises: its span says failed with the error's type; the attempt's span
    carries the turn's error status."""
    ai = Engine(model=LookupModel(), state_keys=TEST_STATE_KEYS)

    def lookup(data: Any) -> dict[str, str]:
        raise ValueError("index offline")

    tool = ai.define_tool(name="lookup", fn=lookup)
    agent = ai.define_agent(name="clerk", tools=[tool], store=store, execution="workers")
    sent = await agent.chat().send("Find my invoices.", wait=False)
    async with WorkerPool(ai, concurrency=1, poll_interval=0.05, scheduler=False):
        with pytest.raises(Exception, match="index offline"):
            await agent.wait(str(sent.snapshot_id), timeout=20)

    spans = traced.spans()
    (tool_span,) = named(spans, "execute_tool lookup")
    (turn,) = named(spans, "invoke_agent clerk")
    assert (tool_span.attributes or {})["turnstile.tool.outcome"] == "failed"
    assert (tool_span.attributes or {})["error.type"] == "ToolError"
    assert tool_span.status.status_code is StatusCode.ERROR
    assert (turn.attributes or {})["turnstile.turn.status"] == "failed"
    assert turn.status.status_code is StatusCode.ERROR
    assert "index offline" in (turn.status.description or "")


async def test_with_no_tracer_provider_nothing_is_recorded(store: SqlSessionStore) -> None:
    """Unconfigured (the API's no-op default): the caller's span is a stand-in, no context is
    stored, and the worker's spans record nothing."""
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    ai, agent, seen = lookup_agent(store)
    with trace.get_tracer("test-caller").start_as_current_span("POST /api/clerk") as request:
        assert not request.is_recording()
        sent = await agent.chat().send("Find my invoices.", wait=False)
    stored = await store.get_turn(str(sent.snapshot_id))
    assert stored is not None and stored.trace_context is None

    assert await run_queued(ai, agent, str(sent.snapshot_id)) == "found"
    assert seen.recording == [False]
    assert seen.trace_ids == [None]


async def test_without_a_provider_a_propagated_context_still_reaches_the_worker(
    store: SqlSessionStore,
) -> None:
    """A request that arrived with a ``traceparent`` (extracted, nothing recorded in this
    process) stores it, and the worker runs the turn inside that trace: its log lines can
    carry the trace id although no span is exported."""
    incoming = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=opaque",
    }
    ai, agent, seen = lookup_agent(store)
    token = otel_context.attach(TraceContextTextMapPropagator().extract(incoming))
    try:
        sent = await agent.chat().send("Find my invoices.", wait=False)
    finally:
        otel_context.detach(token)
    stored = await store.get_turn(str(sent.snapshot_id))
    assert stored is not None and stored.trace_context == incoming

    assert await run_queued(ai, agent, str(sent.snapshot_id)) == "found"
    assert seen.recording == [False]
    assert seen.trace_ids == ["0af7651916cd43dd8448eb211c80319c"]


async def healthy(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def test_an_http_request_carrying_a_traceparent_is_the_turns_parent(
    traced: Tracing, store: SqlSessionStore
) -> None:
    """Over HTTP: the request's server span continues the caller's ``traceparent`` (named by
    route template), the queued turn stores that span's context, and the worker's span of the
    attempt is its child."""
    ai, _, _ = lookup_agent(store)
    app = create_app(
        ai,
        routes=[Route("/healthz", healthy)],
        middleware=[request_span_middleware(tracer_provider=traced.provider)],
    )
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    body = {"data": {"message": {"role": "user", "content": [{"text": "Find my invoices."}]}}}
    async with (
        serve_in_loop(app) as url,
        WorkerPool(ai, concurrency=1, poll_interval=0.05, scheduler=False),
        httpx.AsyncClient(timeout=20) as http,
    ):
        assert (await http.get(f"{url}/healthz")).status_code == 200
        reply = await http.post(
            f"{url}/api/clerk",
            json=body,
            headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"},
        )
    assert reply.status_code == 200, reply.text

    spans = traced.spans()
    assert not [s for s in spans if "healthz" in s.name], "probes get no span"
    (server,) = named(spans, "POST /api/{agent}")
    (turn,) = named(spans, "invoke_agent clerk")
    assert server.kind is SpanKind.SERVER
    assert (server.attributes or {})["http.route"] == "/api/{agent}"
    assert parent_of(server) == int(caller_span, 16)
    assert parent_of(turn) == span_id(server)
    assert {trace_id(s) for s in spans} == {int(caller_trace, 16)}
    stored = await store.get_turn(str((turn.attributes or {})["turnstile.turn.id"]))
    assert stored is not None and stored.trace_context is not None
    assert f"{span_id(server):016x}" in stored.trace_context["traceparent"]
