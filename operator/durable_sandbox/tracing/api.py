"""The tracing extension point: :class:`Tracing` is the value the engine carries (``Engine(extensions=[...])``)
around a :class:`~durable_sandbox.tracing.spans.Spans` implementation. Typed like Temporal's interceptors: the
hooks name what they trace, never how it is exported."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from durable_sandbox.tracing.spans import Spans
from durable_sandbox.tracing.traceparent import TRACE_UI_ENV


class Tracing:
    """The engine's tracing, as an extension value: ``Engine(extensions=[Tracing.from_env()])`` or
    ``Tracing.opentelemetry(tracer_provider)``. Without one the hooks do nothing."""

    def __init__(self, spans: Spans, *, ui_url: str | None = None) -> None:
        self.spans = spans
        # A trace UI's address with ``{trace_id}`` (the web view links a run to its trace; docs/operations.md).
        self.ui_url = ui_url

    @classmethod
    def opentelemetry(cls, tracer_provider: Any = None, *, ui_url: str | None = None) -> Tracing:
        """Spans through OpenTelemetry: ``tracer_provider`` (default: the global one the application set)."""
        from durable_sandbox.tracing.otel import OtelSpans

        return cls(OtelSpans(tracer_provider), ui_url=ui_url)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Tracing | None:
        """Tracing as OpenTelemetry's environment configures it, or None when it is off (the default):
        on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set or ``OTEL_TRACES_EXPORTER``
        names an exporter, off when ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``. Off, nothing
        of OpenTelemetry is imported. Sampling: ``OTEL_TRACES_SAMPLER``/``_ARG``; name: ``OTEL_SERVICE_NAME``."""
        env = os.environ if environ is None else environ
        if not enabled(env):
            return None
        from durable_sandbox.tracing.otel import provider_from_env

        return cls.opentelemetry(provider_from_env(), ui_url=env.get(TRACE_UI_ENV) or None)


def enabled(env: Mapping[str, str]) -> bool:
    """Whether OpenTelemetry's environment asks for traces (see :meth:`Tracing.from_env`)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
