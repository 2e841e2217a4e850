"""The view's templates (server-side, Jinja2 with autoescaping) and the filters they use."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from typing import Any

import jinja2

from durable_sandbox.tracing.traceparent import TRACE_UI_ENV, trace_link
from durable_sandbox.ui.redact import redact

__all__ = ["BOUND", "bounded_json", "bounded_text", "environment", "fmt_duration", "fmt_when"]

# Tool output and values are shown up to this many characters each; the rest is in `dsb history -o json`.
BOUND = 64 * 1024


def fmt_when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def iso(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fmt_duration(start: float | None, end: float | None = None) -> str:
    if start is None:
        return "-"
    seconds = max((end if end is not None else time.time()) - start, 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {sec}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def bounded_text(text: Any, limit: int = BOUND) -> dict[str, Any]:
    """``{"text", "cut"}``: at most ``limit`` characters of ``text``, and how many more there were."""
    value = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    return {"text": value[:limit], "cut": max(len(value) - limit, 0)}


def bounded_json(value: Any, limit: int = BOUND) -> dict[str, Any]:
    """A value as indented JSON with secrets masked, bounded like :func:`bounded_text`."""
    return bounded_text(json.dumps(redact(value), indent=2, ensure_ascii=False, default=str), limit)


def _pretty(value: Any) -> str:
    shown = bounded_json(value)
    return shown["text"] + (f"\n… {shown['cut']} more characters (`dsb inspect -o json` shows all)" if shown["cut"] else "")


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("durable_sandbox.ui", "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = fmt_when
    env.filters["iso"] = iso
    env.filters["pretty"] = _pretty
    env.globals["duration"] = fmt_duration
    # The run's trace in a trace UI, when one is configured (docs/operations.md, "Traces").
    env.globals["trace_url"] = lambda labels: trace_link(labels, os.environ.get(TRACE_UI_ENV))
    return env
