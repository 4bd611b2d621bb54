"""The HTTP server's span of each request, continuing the caller's trace.

OpenTelemetry's ASGI middleware reads the request's W3C ``traceparent``/``tracestate``
headers and makes the request's span current while the route runs, so a turn the request
creates stores that span's context (:func:`engine.telemetry.tracing.capture_trace_context`) and the
worker that runs the turn continues the caller's trace. With no tracer provider installed the
span records nothing but still carries an incoming context, so a worker that exports spans
joins the caller's trace even when the server exports none.

Spans are named by route template (``POST /api/{agent}``), not by path, so an approval's id
never becomes a span name; the probes and ``/metrics`` get none.
"""

from __future__ import annotations

from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.trace import TracerProvider
from starlette.middleware import Middleware
from starlette.routing import Match
from starlette.types import Scope

__all__ = ["UNTRACED_PATHS", "request_span_middleware"]

#: Requests that get no span: probes and scrapes, frequent and of no interest in a trace.
UNTRACED_PATHS = ("/healthz", "/readyz", "/metrics")


def request_span_middleware(*, tracer_provider: TracerProvider | None = None) -> Middleware:
    """Middleware for :func:`engine.remote.server.create_app`'s ``middleware`` (put it first,
    so the span covers every other middleware): one server span per request, a child of the
    caller's when the request carries a ``traceparent``. ``tracer_provider``: default, the
    process's global one (installed by :func:`engine.telemetry.tracing.configure_tracing`)."""
    return Middleware(
        OpenTelemetryMiddleware,
        default_span_details=span_details,
        excluded_urls=",".join(f"{path}$" for path in UNTRACED_PATHS),
        exclude_spans=["receive", "send"],
        tracer_provider=tracer_provider,
    )


def span_details(scope: Scope) -> tuple[str, dict[str, str]]:
    """The request's span name and route attribute: ``METHOD /route/{template}``, or the
    method alone for a path no route serves."""
    method = str(scope.get("method") or "HTTP")
    app = scope.get("app")
    for route in getattr(app, "routes", ()):
        match, _ = route.matches(scope)
        if match is Match.FULL:
            template = str(getattr(route, "path", ""))
            if template:
                return f"{method} {template}", {"http.route": template}
    return method, {}
