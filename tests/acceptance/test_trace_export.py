"""Spans exported by a worker process configured only by its ``OTEL_*`` environment, joined
to the trace of the request that queued the turn in another process.

The test process queues a turn inside an incoming request's trace context (a ``traceparent``
as an HTTP request would bring it); a separate worker process
(:mod:`tests.acceptance.traced_worker`) claims and runs it from PostgreSQL and exports its
spans: to its standard output (``console``), or over OTLP/HTTP to a collector the test
serves. The worker's span of the attempt is a child of the request's span.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from stores import SqlSessionStore
from tests.acceptance.durable_support import REPO_ROOT
from tests.acceptance.traced_worker import echo_agent
from tests.databases import drop_postgres_database, new_postgres_database

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
REQUEST_SPAN_ID = "00f067aa0ba902b7"
REQUEST = {"traceparent": f"00-{TRACE_ID}-{REQUEST_SPAN_ID}-01"}
WORKER_SPANS = ["invoke_agent echo", "turnstile.round", "chat scripted"]


@pytest.fixture
async def database() -> AsyncIterator[str]:
    url = new_postgres_database()
    try:
        yield url
    finally:
        drop_postgres_database(url)


async def queue_turn(url: str) -> str:
    """Queue a turn of ``echo`` as a request carrying :data:`REQUEST` would; its id."""
    store = SqlSessionStore(url)
    try:
        _, agent = echo_agent(store)
        token = otel_context.attach(TraceContextTextMapPropagator().extract(REQUEST))
        try:
            sent = await agent.chat().send("hello", wait=False)
        finally:
            otel_context.detach(token)
        return str(sent.snapshot_id)
    finally:
        await store.close()


@dataclass
class WorkerRun:
    """What the worker process printed: the console exporter's output, and its result."""

    stdout: str
    result: dict[str, Any]


async def run_worker(url: str, turn_id: str, otel: dict[str, str]) -> WorkerRun:
    """Run the traced worker on the turn with ``otel`` as its only ``OTEL_*`` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(otel)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.acceptance.traced_worker",
        url,
        turn_id,
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()
    result = json.loads(stderr.decode().strip().splitlines()[-1])
    assert result["text"] == "Echo: hello"
    return WorkerRun(stdout.decode(), result)


def console_spans(text: str) -> list[dict[str, Any]]:
    """The span objects the console exporter wrote (JSON documents one after another)."""
    decoder, spans, position = json.JSONDecoder(), [], 0
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        span, position = decoder.raw_decode(text, position)
        spans.append(span)
    return spans


async def test_a_console_exporter_prints_the_worker_spans_under_the_request(
    database: str,
) -> None:
    turn_id = await queue_turn(database)
    run = await run_worker(
        database,
        turn_id,
        {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "billing-worker"},
    )
    assert run.result["configured"] is True
    spans = {span["name"]: span for span in console_spans(run.stdout)}
    assert sorted(spans) == sorted(WORKER_SPANS)
    turn = spans["invoke_agent echo"]
    assert turn["parent_id"] == f"0x{REQUEST_SPAN_ID}"
    assert {span["context"]["trace_id"] for span in spans.values()} == {f"0x{TRACE_ID}"}
    assert spans["turnstile.round"]["parent_id"] == turn["context"]["span_id"]
    assert turn["attributes"]["turnstile.turn.id"] == turn_id
    assert turn["resource"]["attributes"]["service.name"] == "billing-worker"


@dataclass
class Collector:
    """An OTLP/HTTP trace receiver: the export requests it was sent."""

    endpoint: str
    received: list[ExportTraceServiceRequest] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


@pytest.fixture
def collector() -> Iterator[Collector]:
    found: list[ExportTraceServiceRequest] = []
    paths: list[str] = []

    class Receive(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            paths.append(self.path)
            found.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test reads what arrived, not the access log

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Collector(f"http://127.0.0.1:{server.server_port}", found, paths)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def exported(collector: Collector) -> tuple[dict[str, Any], list[Any]]:
    """The resource attributes and the spans the collector received."""
    resources, spans = {}, []
    for request in collector.received:
        for resource_spans in request.resource_spans:
            for attribute in resource_spans.resource.attributes:
                resources[attribute.key] = attribute.value.string_value
            for scope_spans in resource_spans.scope_spans:
                spans.extend(scope_spans.spans)
    return resources, spans


async def test_an_otlp_endpoint_alone_exports_the_spans_over_http(
    database: str, collector: Collector
) -> None:
    """Only OTEL_EXPORTER_OTLP_ENDPOINT set: OTLP over HTTP/protobuf to ``/v1/traces``, under
    the service name ``turnstile``."""
    turn_id = await queue_turn(database)
    run = await run_worker(database, turn_id, {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint})
    assert run.result["configured"] is True
    assert run.stdout == ""
    assert set(collector.paths) == {"/v1/traces"}
    resource, spans = exported(collector)
    assert resource["service.name"] == "turnstile"
    by_name = {span.name: span for span in spans}
    assert sorted(by_name) == sorted(WORKER_SPANS)
    turn = by_name["invoke_agent echo"]
    assert turn.parent_span_id.hex() == REQUEST_SPAN_ID
    assert {span.trace_id.hex() for span in spans} == {TRACE_ID}
    chat = {a.key: a.value for a in by_name["chat scripted"].attributes}
    assert chat["gen_ai.operation.name"].string_value == "chat"
    assert chat["gen_ai.request.model"].string_value == "scripted"


async def test_exporter_none_exports_nothing_even_with_an_endpoint(
    database: str, collector: Collector
) -> None:
    turn_id = await queue_turn(database)
    run = await run_worker(
        database,
        turn_id,
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint},
    )
    assert run.result["configured"] is False
    assert (run.stdout, collector.received) == ("", [])
