"""Which span exporters the ``OTEL_*`` variables configure, how a bad configuration is
refused, and the trace context a request hands to the turns it creates.

None of these installs a tracer provider in the test process (exporting is tested in
``tests/acceptance/test_trace_export.py``, in processes of its own).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from engine.telemetry import tracing
from engine.telemetry.tracing import TracingConfig, TracingConfigError, exporter_names
from stores.settings import Settings, read_settings

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def config_of(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], TracingConfig]:
    """The tracing configuration the settings read from an environment holding exactly
    these ``OTEL_*`` variables."""

    def read(environ: dict[str, str]) -> TracingConfig:
        for variable in Settings.variables():
            if variable.startswith("OTEL_"):
                monkeypatch.delenv(variable, raising=False)
        for variable, value in environ.items():
            monkeypatch.setenv(variable, value)
        return read_settings().tracing_config()

    return read


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": " None "}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp_proto_http"]),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            ["otlp_proto_grpc"],
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            ["otlp_proto_http"],
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp_proto_http"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp_proto_http"]),
        (
            {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
            [],
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp, console,otlp"}, ["otlp_proto_http", "console"]),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, []),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"}, ["console"]),
    ],
)
def test_the_exporters_the_environment_configures(
    config_of: Callable[[dict[str, str]], TracingConfig],
    environ: dict[str, str],
    expected: list[str],
) -> None:
    """OTEL_TRACES_EXPORTER names them; an OTLP endpoint alone means otlp (HTTP by default);
    none or OTEL_SDK_DISABLED turn them off."""
    assert exporter_names(config_of(environ)) == expected


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTLP protocol 'http/json' is not supported: use one of grpc, http/protobuf.",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "console,none"},
            "OTEL_TRACES_EXPORTER='console,none': 'none' cannot be combined with exporters.",
        ),
    ],
)
def test_a_contradictory_configuration_is_refused(
    config_of: Callable[[dict[str, str]], TracingConfig], environ: dict[str, str], message: str
) -> None:
    """An unsupported OTLP protocol, or none beside exporters, names what is wrong."""
    with pytest.raises(TracingConfigError) as refused:
        exporter_names(config_of(environ))
    assert str(refused.value) == message


def test_nothing_is_installed_without_exporter_variables(
    config_of: Callable[[dict[str, str]], TracingConfig],
) -> None:
    """No exporter configured: no tracer provider is installed."""
    assert tracing.configure_tracing(config_of({})) is False
    assert tracing.configure_tracing(TracingConfig()) is False
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_an_exporter_that_is_not_installed_is_named() -> None:
    """An unknown exporter, or OTLP over gRPC without its package: refused before anything
    is installed, naming what is missing and what there is."""
    with pytest.raises(TracingConfigError, match=r"No span exporter named 'zipkin_json'; "):
        tracing.configure_tracing(TracingConfig(traces_exporter="zipkin_json"))
    with pytest.raises(TracingConfigError) as refused:
        tracing.configure_tracing(TracingConfig(traces_exporter="otlp", otlp_protocol="grpc"))
    assert "(install opentelemetry-exporter-otlp-proto-grpc)" in str(refused.value)
    assert "console" in str(refused.value)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_outside_a_trace_there_is_no_context_and_no_trace_id() -> None:
    assert tracing.capture_trace_context() is None
    assert tracing.current_trace_id() is None


def test_inside_a_trace_the_context_is_captured_in_w3c_form() -> None:
    """Also when no provider records anything: a context that arrived with a request is
    handed on as it came."""
    incoming = {"traceparent": PARENT, "tracestate": "rojo=00f067aa0ba902b7"}
    token = otel_context.attach(TraceContextTextMapPropagator().extract(incoming))
    try:
        assert tracing.capture_trace_context() == incoming
        assert tracing.current_trace_id() == "0af7651916cd43dd8448eb211c80319c"
    finally:
        otel_context.detach(token)
