"""OpenTelemetry spans of a turn's run, and the trace context a turn carries across the queue.

A turn is created in one process (the caller's request) and run in another (a worker), with
the database in between. The creating request's W3C trace context (``traceparent`` and
``tracestate``) is stored with the turn (:func:`capture_trace_context`, written to
``turns.trace_context``), and the worker starts its span of the attempt as a child of it
(:func:`turn_span`), so one trace shows the request, the wait in the queue and the run:

    invoke_agent {agent}          one per attempt of the turn (the worker's claim)
      turnstile.round             one per model round the attempt runs (round 0: a resume)
        chat {model}              the model call, with the GenAI semantic conventions
        execute_tool {tool}       each tool call the round runs

The engine depends on the OpenTelemetry API alone. Its default tracer provider is a no-op, so
unless something installs one — :func:`configure_tracing` from a :class:`TracingConfig` (the
CLI passes the ``OTEL_*`` variables' values, read by ``stores.settings``), the application
itself, or :func:`use_tracer_provider` — every span here is a non-recording stand-in and no
attribute is computed. The SDK is imported only by :func:`configure_tracing`, and only when an
exporter is configured.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context, attach, detach
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from engine.errors import TurnstileError
from engine.status import TurnStatus

if TYPE_CHECKING:
    from engine.model import ModelUsage
    from engine.store import ToolCallRecord, TurnRecord

__all__ = [
    "TRACER_NAME",
    "TracingConfig",
    "TracingConfigError",
    "capture_trace_context",
    "configure_tracing",
    "current_trace_id",
    "exporter_names",
    "model_answered",
    "model_span",
    "round_span",
    "tool_finished",
    "tool_span",
    "turn_settled",
    "turn_span",
    "use_tracer_provider",
]

logger = logging.getLogger("turnstile.tracing")

#: The instrumentation scope of every span Turnstile starts.
TRACER_NAME = "turnstile"

#: Turns store their creator's context in W3C form whatever propagators the process uses for
#: its own requests: the column has one format, readable by any worker.
_W3C = TraceContextTextMapPropagator()

#: A proxy until a provider is installed, then that provider's tracer (see
#: :func:`use_tracer_provider`).
_tracer: trace.Tracer = trace.get_tracer(TRACER_NAME)
#: Whether spans may record: a provider was given to :func:`use_tracer_provider`, or one was
#: seen installed globally (which can happen only once per process, so it is remembered).
_recording = False

#: What every span helper returns while nothing can record. A no-op tracer's child span is
#: its parent again, so not starting one changes nothing but what it would cost.
_NO_SPAN: AbstractContextManager[Span] = nullcontext(trace.INVALID_SPAN)

#: Whether the attempt running in this context records its span: the runner's spans (rounds,
#: model and tool calls) are recorded exactly when it is, and cost a lookup otherwise.
_attempt_recorded: ContextVar[bool] = ContextVar("turnstile_attempt_recorded", default=False)


class TracingConfigError(TurnstileError):
    """The ``OTEL_*`` variables ask for an exporter or a protocol that cannot be used."""


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Start Turnstile's spans with ``provider`` rather than the process's global one.

    For an application (or a test) that keeps its provider to itself instead of installing
    it with ``opentelemetry.trace.set_tracer_provider``. ``None`` returns to the global
    provider.
    """
    global _tracer, _recording
    # Without one, a fresh proxy: a global provider installed later is still picked up.
    _tracer = (
        trace.get_tracer(TRACER_NAME) if provider is None else provider.get_tracer(TRACER_NAME)
    )
    _recording = provider is not None


def _may_record() -> bool:
    """Whether a tracer provider that can record is in place (checked at each span, since an
    application may install one at any time; cheap until then)."""
    global _recording
    if not _recording and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _recording = True
    return _recording


# -- trace context ------------------------------------------------------------------------


def capture_trace_context() -> dict[str, str] | None:
    """The current span's W3C trace context (``traceparent``, and ``tracestate`` when set),
    to store with a turn this request creates; ``None`` outside a trace."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier or None


def current_trace_id() -> str | None:
    """The current trace's id as 32 lowercase hex digits (as log lines carry it), or
    ``None`` outside a trace."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return trace.format_trace_id(span_context.trace_id)


def _parent_of(turn: TurnRecord) -> Context:
    """The context the worker's span of ``turn`` starts in: the stored creator's span, or an
    empty context (a new trace), never the worker's own surroundings."""
    if not turn.trace_context:
        return Context()
    return _W3C.extract(turn.trace_context, context=Context())


# -- spans of a turn's run ----------------------------------------------------------------


def turn_span(turn: TurnRecord) -> AbstractContextManager[Span]:
    """The span of one attempt of ``turn``, current while it runs: a child of the span that
    created the turn when one was stored, else the root of a new trace.

    With nothing to record, only a stored context is made current (so log lines about the
    turn carry its trace id), as a no-op tracer's span would."""
    if _may_record():
        return _turn_span(turn)
    if turn.trace_context:
        return _continued(turn.trace_context)
    return _NO_SPAN


@contextmanager
def _continued(carrier: dict[str, str]) -> Iterator[Span]:
    token = attach(_W3C.extract(carrier, context=Context()))
    try:
        yield trace.get_current_span()
    finally:
        detach(token)


@contextmanager
def _turn_span(turn: TurnRecord) -> Iterator[Span]:
    with _tracer.start_as_current_span(
        f"invoke_agent {turn.agent}", context=_parent_of(turn), kind=SpanKind.CONSUMER
    ) as span:
        recorded = span.is_recording()
        if recorded:
            span.set_attributes(
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": turn.agent,
                    "gen_ai.conversation.id": turn.session_id,
                    "turnstile.turn.id": turn.id,
                    "turnstile.turn.kind": turn.input.kind,
                    "turnstile.turn.attempt": turn.attempts,
                }
            )
        token = _attempt_recorded.set(recorded)
        try:
            yield span
        finally:
            _attempt_recorded.reset(token)


def turn_settled(span: Span, record: TurnRecord) -> None:
    """Note on the attempt's span where the turn stands after it: its status (``pending``
    again when a transient failure is retried) and finish reason; a failure is an error."""
    if not span.is_recording():
        return
    span.set_attribute("turnstile.turn.status", record.status.value)
    if record.finish_reason is not None:
        span.set_attribute("turnstile.turn.finish_reason", record.finish_reason.value)
    failed = record.status is TurnStatus.FAILED or (
        record.status is TurnStatus.PENDING and record.error is not None
    )
    if failed and record.error is not None:
        span.set_attribute("error.type", record.error.status)
        span.set_status(Status(StatusCode.ERROR, record.error.message))


def round_span(number: int) -> AbstractContextManager[Span]:
    """The span of round ``number`` of the running turn (0: a resume answering its pause)."""
    return _round_span(number) if _attempt_recorded.get() else _NO_SPAN


@contextmanager
def _round_span(number: int) -> Iterator[Span]:
    with _tracer.start_as_current_span("turnstile.round") as span:
        if span.is_recording():
            span.set_attribute("turnstile.round", number)
        yield span


def _provider_and_model(model_name: str) -> tuple[str, str]:
    """``openai:gpt-4o`` → ``("openai", "gpt-4o")``; a name without a provider is both."""
    provider, _, model = model_name.partition(":")
    return (provider, model) if model else (model_name, model_name)


def model_span(model_name: str) -> AbstractContextManager[Span]:
    """The span of one model call (GenAI semantic conventions: a ``chat`` client span)."""
    return _model_span(model_name) if _attempt_recorded.get() else _NO_SPAN


@contextmanager
def _model_span(model_name: str) -> Iterator[Span]:
    provider, model = _provider_and_model(model_name)
    with _tracer.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": provider,
                    "gen_ai.system": provider,
                    "gen_ai.request.model": model,
                }
            )
        try:
            yield span
        except Exception as exc:
            if span.is_recording():
                span.set_attribute("error.type", type(exc).__qualname__)
            raise


def model_answered(span: Span, finish_reason: str, usage: ModelUsage | None) -> None:
    """Note the model's answer on its span: the finish reason and the tokens reported."""
    if not span.is_recording():
        return
    span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    if usage is not None and usage.input_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
    if usage is not None and usage.output_tokens is not None:
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)


def tool_span(row: ToolCallRecord) -> AbstractContextManager[Span]:
    """The span of one run of the journaled call ``row`` (GenAI ``execute_tool``)."""
    return _tool_span(row) if _attempt_recorded.get() else _NO_SPAN


@contextmanager
def _tool_span(row: ToolCallRecord) -> Iterator[Span]:
    with _tracer.start_as_current_span(f"execute_tool {row.name}") as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": row.name,
                    "gen_ai.tool.call.id": row.ref,
                    "turnstile.tool.idempotency_key": row.idempotency_key,
                    "turnstile.round": row.round,
                }
            )
        try:
            yield span
        except Exception as exc:
            if span.is_recording():
                span.set_attributes(
                    {"turnstile.tool.outcome": "failed", "error.type": type(exc).__qualname__}
                )
            raise


def tool_finished(span: Span, outcome: str) -> None:
    """Note how the call ended: ``done`` (it returned) or ``interrupted`` (it paused)."""
    if span.is_recording():
        span.set_attribute("turnstile.tool.outcome", outcome)


# -- configuration ------------------------------------------------------------------------

#: ``OTEL_EXPORTER_OTLP_PROTOCOL`` → the exporter's entry point name in the SDK's group.
_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
#: The package that provides each OTLP exporter, named when it is missing.
_OTLP_PACKAGES = {
    "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http",
    "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
}


@dataclass(frozen=True)
class TracingConfig:
    """The OpenTelemetry configuration :func:`configure_tracing` acts on: the values of the
    standard variables named beside each field (``stores.settings.Settings.tracing_config``
    reads them). The SDK and the OTLP exporter read their other variables (batching,
    sampler, headers, ...) themselves."""

    traces_exporter: str | None = None
    """``OTEL_TRACES_EXPORTER``: comma-separated exporter names, or ``none``."""
    otlp_endpoint: str | None = None
    """``OTEL_EXPORTER_OTLP_ENDPOINT``: set alone, it means the ``otlp`` exporter."""
    otlp_traces_endpoint: str | None = None
    """``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``: likewise."""
    otlp_protocol: str | None = None
    """``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf`` (the default) or ``grpc``."""
    otlp_traces_protocol: str | None = None
    """``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``: wins over the one above."""
    sdk_disabled: bool = False
    """``OTEL_SDK_DISABLED``: no exporter, whatever the rest says."""
    service_name: str | None = None
    """``OTEL_SERVICE_NAME``: without it (or a ``service.name`` in the attributes) the
    service is ``turnstile``."""
    resource_attributes: str | None = None
    """``OTEL_RESOURCE_ATTRIBUTES``: ``key=value,…`` of every span's resource."""


def exporter_names(config: TracingConfig) -> list[str]:
    """The span exporters ``config`` configures, as the SDK's entry point names
    (``otlp_proto_http``, ``console``, ...); empty when it configures none.

    ``OTEL_TRACES_EXPORTER`` names them (comma-separated; ``none`` for none); unset, an
    ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` means ``otlp``. ``otlp`` is OTLP over HTTP
    (protobuf) unless ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` says ``grpc``.
    ``OTEL_SDK_DISABLED=true`` turns everything off.
    """
    if config.sdk_disabled:
        return []
    listed = (config.traces_exporter or "").strip()
    if not listed:
        endpoints = (config.otlp_traces_endpoint, config.otlp_endpoint)
        listed = "otlp" if any((value or "").strip() for value in endpoints) else ""
    names = [name.strip() for name in listed.split(",") if name.strip()]
    if not names or [name.lower() for name in names] == ["none"]:
        return []
    if "none" in (name.lower() for name in names):
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER={listed!r}: 'none' cannot be combined with exporters."
        )
    protocol = (
        config.otlp_traces_protocol or config.otlp_protocol or ""
    ).strip() or "http/protobuf"
    resolved: list[str] = []
    for name in names:
        if name == "otlp":
            if protocol not in _OTLP_BY_PROTOCOL:
                raise TracingConfigError(
                    f"OTLP protocol {protocol!r} is not supported: use one of "
                    f"{', '.join(sorted(_OTLP_BY_PROTOCOL))}."
                )
            name = _OTLP_BY_PROTOCOL[protocol]
        if name not in resolved:
            resolved.append(name)
    return resolved


def configure_tracing(config: TracingConfig) -> bool:
    """Install the SDK's tracer provider when ``config`` configures an exporter (see
    :func:`exporter_names`); ``True`` when it did.

    Each exporter gets a batch span processor (``OTEL_BSP_*``, read by the SDK); the
    resource is named ``turnstile`` unless ``config`` names the service; the SDK reads the
    sampler (``OTEL_TRACES_SAMPLER``). Nothing is installed when no exporter is configured,
    or when the process already has a provider (the application's own is kept). Raises
    :class:`TracingConfigError` for an exporter that is unknown or not installed.
    """
    names = exporter_names(config)
    if not names:
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        logger.info("a tracer provider is already installed: OTEL_TRACES_EXPORTER left to it")
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = [_load_exporter(name) for name in names]
    named = bool(config.service_name) or "service.name=" in (config.resource_attributes or "")
    provider = SdkTracerProvider(
        resource=Resource.create({} if named else {SERVICE_NAME: TRACER_NAME})
    )
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter()))
    trace.set_tracer_provider(provider)
    logger.info("traces exported with %s", ", ".join(names))
    return True


def _load_exporter(name: str) -> type:
    """The span exporter class the SDK's entry point ``name`` provides."""
    from importlib.metadata import entry_points

    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        package = _OTLP_PACKAGES.get(name)
        hint = f" (install {package})" if package else ""
        known = sorted({e.name for e in entry_points(group="opentelemetry_traces_exporter")})
        raise TracingConfigError(
            f"No span exporter named {name!r}{hint}; installed: {', '.join(known) or 'none'}."
        )
    exporter: type = next(iter(found)).load()
    return exporter
