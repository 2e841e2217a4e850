"""W3C trace context (``traceparent``) as the engine carries it: in a run's labels, and in a sandbox call's env."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

# The caller's trace context, recorded on the run when it is created (the client library's labels, the
# ``TRACEPARENT`` env of ``dsb run``, the caller's current span, a Workflow's annotation): every attempt of the
# run is its child. A label value may hold it (55 characters of hex digits and dashes).
TRACEPARENT_LABEL = "durable-sandbox.dev/traceparent"
# The same name as a Workflow's annotation: ``kubectl apply`` of a Workflow annotated with a traceparent (a CI
# job's, a GitOps controller's) records it on the run, whose attempts become its children.
TRACEPARENT_ANNOTATION = TRACEPARENT_LABEL
# The newest attempt's own span, recorded when the attempt starts: the next attempt (a resume after a crash,
# a retry, a wake-up) links to it, so the trace of a run that spans processes can be followed back.
ATTEMPT_LABEL = "durable-sandbox.dev/trace-attempt"
# What a sandbox call's environment gets, so that the agent's own tools continue the trace; also what
# ``dsb run`` reads as its caller's context (the convention of otel-cli and others).
TRACEPARENT_ENV = "TRACEPARENT"
# A trace UI's page of one trace, with ``{trace_id}`` (Jaeger: https://jaeger.example/trace/{trace_id}); the web
# view links a run to its trace when it is set (the chart's tracing.uiUrl).
TRACE_UI_ENV = "DURABLE_SANDBOX_TRACE_UI"

_TRACEPARENT = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")


def valid_traceparent(value: object) -> str | None:
    """``value`` if it is a version-00 W3C traceparent with non-zero ids, else None (ignored, never an error:
    a malformed header from a caller must not fail a run)."""
    if isinstance(value, str) and _TRACEPARENT.match(value.strip()):
        return value.strip()
    return None


def trace_link(labels: Mapping[str, str], ui_url: str | None) -> str | None:
    """The trace UI's page of a run's trace: its newest attempt's trace (each attempt without a caller is a
    trace of its own), else its caller's; None without a UI or a recorded trace."""
    if not ui_url or "{trace_id}" not in ui_url:
        return None
    tp = valid_traceparent(labels.get(ATTEMPT_LABEL)) or valid_traceparent(labels.get(TRACEPARENT_LABEL))
    return ui_url.replace("{trace_id}", tp.split("-")[1]) if tp else None


def annotated_caller(annotations: Mapping[str, str] | None) -> dict[str, str]:
    """The run label a Workflow's traceparent annotation gives (none for none or a malformed one). What it can
    change is where the run's spans hang in a trace, nothing the operator runs or believes: so an annotation,
    which users without write access to the spec may set, is enough."""
    tp = valid_traceparent((annotations or {}).get(TRACEPARENT_ANNOTATION))
    return {TRACEPARENT_LABEL: tp} if tp else {}


def outgoing_traceparent() -> str | None:
    """The trace context a request this process sends should carry (``traceparent`` header): the current span
    when this process traces with OpenTelemetry (already imported: never imported here), else ``TRACEPARENT`` in
    the environment (a tool running inside a sandbox call, which got it from the call's span)."""
    if "opentelemetry.trace" in sys.modules:
        from opentelemetry import trace

        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    return valid_traceparent(os.environ.get(TRACEPARENT_ENV))
