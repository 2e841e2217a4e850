"""W3C trace context (``traceparent``) as the engine carries it: in a run's labels, and in a sandbox call's env."""

from __future__ import annotations

import re

# The caller's trace context, recorded on the run when it is created (the client library's labels, the
# ``TRACEPARENT`` env of ``dsb run``, the caller's current span, a Workflow's annotation): every attempt of the
# run is its child. A label value may hold it (55 characters of hex digits and dashes).
TRACEPARENT_LABEL = "durable-sandbox.dev/traceparent"
# The newest attempt's own span, recorded when the attempt starts: the next attempt (a resume after a crash,
# a retry, a wake-up) links to it, so the trace of a run that spans processes can be followed back.
ATTEMPT_LABEL = "durable-sandbox.dev/trace-attempt"
# What a sandbox call's environment gets, so that the agent's own tools continue the trace; also what
# ``dsb run`` reads as its caller's context (the convention of otel-cli and others).
TRACEPARENT_ENV = "TRACEPARENT"

_TRACEPARENT = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")


def valid_traceparent(value: object) -> str | None:
    """``value`` if it is a version-00 W3C traceparent with non-zero ids, else None (ignored, never an error:
    a malformed header from a caller must not fail a run)."""
    if isinstance(value, str) and _TRACEPARENT.match(value.strip()):
        return value.strip()
    return None
