"""Traces: OpenTelemetry spans for runs, steps, callbacks and sandbox work (issue 40; docs/operations.md).

Off unless configured (``OTEL_EXPORTER_OTLP_ENDPOINT``, or a :class:`Tracing` given to the engine); off, nothing
here imports OpenTelemetry and the engine's hooks cost one dictionary lookup per operation. This package sits
below the engine and imports nothing else of durable_sandbox: the engine and the sandbox sessions call it
through thin hooks (engine/traced.py, sandboxes/traced.py), the only places that know what a span means.
"""

from durable_sandbox.tracing.api import Tracing
from durable_sandbox.tracing.spans import AttributeValue, SpanHandle, Spans
from durable_sandbox.tracing.traceparent import (
    ATTEMPT_LABEL,
    TRACEPARENT_ANNOTATION,
    TRACEPARENT_ENV,
    TRACEPARENT_LABEL,
    annotated_caller,
    valid_traceparent,
)

__all__ = [
    "ATTEMPT_LABEL",
    "TRACEPARENT_ANNOTATION",
    "TRACEPARENT_ENV",
    "TRACEPARENT_LABEL",
    "AttributeValue",
    "SpanHandle",
    "Spans",
    "Tracing",
    "annotated_caller",
    "valid_traceparent",
]
