"""What a tracing implementation provides (:class:`Spans`) and what the hooks hold while a span is open
(:class:`SpanHandle`): OpenTelemetry's is tracing/otel.py; a test may give its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

AttributeValue = str | bool | int | float | Sequence[str]


class SpanHandle(Protocol):
    """One open span: attributes learnt while it runs, and how it ended."""

    def set(self, key: str, value: AttributeValue | None) -> None:
        """Set an attribute (None: leave it unset)."""

    def fail(self, exc: BaseException) -> None:
        """Mark the span failed with ``exc`` (its type and message; never a secret: messages are redacted
        where they are made, as for the journal)."""

    def traceparent(self) -> str | None:
        """This span's context as a W3C traceparent (None when it is not sampled or not recording)."""


class Spans(Protocol):
    """What the hooks call: open a span as the current one, or add an event to the current one."""

    def span(self, name: str, attributes: Mapping[str, AttributeValue | None], *,
             parent: str | None = None, links: Sequence[str] = ()) -> AbstractContextManager[SpanHandle]:
        """A span current for the body of the ``with``: a child of ``parent`` (a traceparent) when given, else
        of the current span; ``links`` are traceparents of related spans (earlier attempts)."""

    def event(self, name: str, attributes: Mapping[str, AttributeValue | None]) -> None:
        """An event on the current span (a step taken from the journal: no span of its own)."""

    def current(self) -> str | None:
        """The current span as a traceparent (None: none, or not sampled)."""

    def force_flush(self, timeout_seconds: float = 30.0) -> bool:
        """Export what is buffered now (tests, and a process about to exit)."""
