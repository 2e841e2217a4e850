"""The OpenTelemetry implementation of :class:`~durable_sandbox.tracing.api.Spans` (the ``otel`` extra).

Imported only when tracing is on (``Tracing.from_env`` found it configured, or a caller built
``Tracing.opentelemetry``): a process without tracing never imports OpenTelemetry.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context as OtelContext
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

from durable_sandbox.tracing.spans import AttributeValue, SpanHandle
from durable_sandbox.tracing.traceparent import valid_traceparent

INSTRUMENTATION = "durable_sandbox"
DEFAULT_SERVICE_NAME = "durable-sandbox"


def span_context(traceparent: str | None) -> SpanContext | None:
    """The remote span context a traceparent names (None for a malformed one: ignored, as W3C says)."""
    tp = valid_traceparent(traceparent)
    if tp is None:
        return None
    _, trace_id, span_id, flags = tp.split("-")
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16)))


def format_traceparent(ctx: SpanContext) -> str | None:
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _attributes(attributes: Mapping[str, AttributeValue | None]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, list | tuple) else v) for k, v in attributes.items() if v is not None}


class _Handle:
    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set(self, key: str, value: AttributeValue | None) -> None:
        if value is not None:
            self._span.set_attribute(key, list(value) if isinstance(value, list | tuple) else value)

    def fail(self, exc: BaseException) -> None:
        self._span.record_exception(exc)
        self._span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))

    def traceparent(self) -> str | None:
        return format_traceparent(self._span.get_span_context())


class OtelSpans:
    """Spans of the tracer ``durable_sandbox`` of ``tracer_provider`` (default: the global provider)."""

    def __init__(self, tracer_provider: Any = None) -> None:
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION)

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, AttributeValue | None], *,
             parent: str | None = None, links: Sequence[str] = ()) -> Iterator[SpanHandle]:
        remote = span_context(parent)
        context: OtelContext | None = trace.set_span_in_context(NonRecordingSpan(remote)) if remote else None
        linked = [Link(sc) for sc in (span_context(tp) for tp in links) if sc is not None]
        # Errors are marked by the hooks (handle.fail), which know what is a failure: a run that waits on a
        # callback ends its attempt with an exception that is no error.
        with self._tracer.start_as_current_span(name, context=context, attributes=_attributes(attributes),
                                                links=linked, record_exception=False,
                                                set_status_on_exception=False) as span:
            yield _Handle(span)

    def event(self, name: str, attributes: Mapping[str, AttributeValue | None]) -> None:
        trace.get_current_span().add_event(name, _attributes(attributes))

    def current(self) -> str | None:
        return format_traceparent(trace.get_current_span().get_span_context())

    def force_flush(self, timeout_seconds: float = 30.0) -> bool:
        flush = getattr(self._provider, "force_flush", None)
        return bool(flush(int(timeout_seconds * 1000))) if flush is not None else True


def provider_from_env() -> TracerProvider:
    """One tracer provider per process and configuration (several engines in one process share it, and with
    it one batch exporter thread)."""
    keys = sorted(k for k in os.environ if k.startswith("OTEL_"))
    return _provider(tuple((k, os.environ[k]) for k in keys))


@functools.cache
def _provider(env: tuple[tuple[str, str], ...]) -> TracerProvider:
    settings = dict(env)
    attributes = {} if settings.get("OTEL_SERVICE_NAME") else {"service.name": DEFAULT_SERVICE_NAME}
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the SDK reads the sampler
    # (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG) and the batch settings (OTEL_BSP_*) itself.
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in _exporters(settings):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporters(settings: Mapping[str, str]) -> list[SpanExporter]:
    names = [n.strip().lower() for n in (settings.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    out: list[SpanExporter] = []
    for name in names:
        if name == "console":
            out.append(ConsoleSpanExporter())
        elif name == "otlp":
            out.append(_otlp(settings))
        elif name != "none":
            raise ValueError(
                f"OTEL_TRACES_EXPORTER={name!r} is not one durable-sandbox knows; use otlp, console or none"
            )
    return out


def _otlp(settings: Mapping[str, str]) -> SpanExporter:
    protocol = (settings.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or settings.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError as exc:
            raise ValueError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc installed; "
                "install it, or use http/protobuf (the otel extra's exporter)"
            ) from exc
        return GrpcExporter()
    # Reads the endpoint, headers, timeout and compression from OTEL_EXPORTER_OTLP_* itself.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()
