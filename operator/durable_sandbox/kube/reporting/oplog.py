"""The operator's log (``dsb operator --log-format text|json``, docs/operations.md "The operator's log").

``text``: ``<time> <LEVEL> <logger>: <message>``, one line per record. ``json``: one JSON object per line with
``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``, and ``namespace``, ``workflow``,
``run`` where the record is about one (the operator's own records pass them as ``extra=``, see :func:`about`;
kopf's per-object records carry them as ``k8s_ref``), plus ``exception`` when a record has one. Nothing else a
record carries is written: no extra field can leak what a caller did not mean to log.

kopf's own lines (WARNING and up, INFO with ``--verbose``) are kept, re-leveled where kopf says ERROR about what it
retries by design: a request it will retry (``Request attempt #n/m failed; will retry``: the API server away or
starting) is not written, and :class:`~durable_sandbox.kube.api.apiserver_away.ApiServerAway` (the operator's) says so once instead; a
handler that "failed temporarily" (a ``kopf.TemporaryError``: the operator asked to be called again, e.g. a
cleanup the provider refuses for now) is a WARNING. A handler failing with an exception stays an ERROR, with its
traceback.

asyncpg's pool retries its connections by itself while PostgreSQL restarts or is away, with a WARNING and a
traceback each time (``Failed to restore the pool connection floor; retrying``); the PostgreSQL store says that the
database is unreachable and what it does about it, so that WARNING is written in one line, its exception named,
without the traceback (:class:`PoolRetryLines`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
from collections.abc import Mapping
from typing import Any, Literal, TextIO

from durable_sandbox.kube.api.apiserver_away import ApiServerAway

__all__ = ["FORMATS", "LIFECYCLE_LOGGER", "JsonFormatter", "KopfLines", "LogFormat", "PoolRetryLines", "about",
           "configure"]

# The steps of each Workflow's and Sandbox's life, one INFO line each (kube/workflow/publishing.py,
# kube/sandbox/controller.py).
LIFECYCLE_LOGGER = "durable_sandbox.kube.lifecycle"

LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIELDS = ("namespace", "workflow", "run")  # the structured fields a record may carry

# kopf 1.45's wording (kopf/_cogs/clients/api.py, kopf/_core/actions/execution.py); pinned by tests/unit/kube.
KOPF_RETRYING = re.compile(r"Request attempt #\d+(?:/\d+)? failed; (?:will retry|escalating): "
                           r"(?P<method>[A-Z]+) (?:https?://[^/\s]+)?(?P<path>[^?\s]*)")
KOPF_TEMPORARY = " failed temporarily"
KOPF_FORBIDDEN = "APIForbiddenError"  # kopf retries a 403 too: that is no API server away, so kopf's line stays


def about(namespace: str | None, workflow: str | None = None, run: str | None = None) -> dict[str, str]:
    """``extra=`` of a record about one Workflow (or one namespace): the JSON format's structured fields."""
    fields = {"namespace": namespace, "workflow": workflow, "run": run}
    return {key: value for key, value in fields.items() if value}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds")
                    .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if isinstance(value, str) and value:
                doc[key] = value
        ref = getattr(record, "k8s_ref", None)  # kopf's per-object loggers
        if isinstance(ref, Mapping):
            if ref.get("namespace"):
                doc.setdefault("namespace", str(ref["namespace"]))
            if ref.get("kind") == "Workflow" and ref.get("name"):
                doc.setdefault("workflow", str(ref["name"]))
            elif ref.get("name"):
                doc.setdefault("object", f"{ref.get('kind')}/{ref.get('name')}")
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


class KopfLines(logging.Filter):
    """kopf's records as the operator writes them (see the module's docstring); others pass unchanged."""

    def __init__(self, threshold: int, away: ApiServerAway) -> None:
        super().__init__()
        self.threshold = threshold
        self.away = away

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "kopf" and not record.name.startswith("kopf."):
            return True
        message = record.getMessage()
        retrying = KOPF_RETRYING.match(message)
        if retrying is not None and KOPF_FORBIDDEN not in message:
            self.away.failed(f"kopf's {retrying['method']} {retrying['path']}")
            return False
        if record.levelno == logging.ERROR and KOPF_TEMPORARY in message:
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return record.levelno >= self.threshold


class PoolRetryLines(logging.Filter):
    """asyncpg's pool retrying a connection: a WARNING in one line, its exception named, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("asyncpg") and record.levelno < logging.ERROR and record.exc_info:
            exc = record.exc_info[1]
            record.msg, record.args = f"{record.getMessage()} ({type(exc).__name__}: {exc})", None
            record.exc_info = record.exc_text = None
        return True


def configure(log_format: LogFormat = "text", *, verbose: bool = False, stream: TextIO | None = None,
              away: ApiServerAway | None = None) -> logging.Handler:
    """The root logger's one handler, in ``log_format``; kopf's own activity only with ``verbose``. kopf's retries
    of an API server that does not answer are reported to ``away`` (the operator's) instead of written."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(KopfLines(logging.INFO if verbose else logging.WARNING, away or ApiServerAway()))
    handler.addFilter(PoolRetryLines())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("kopf").setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    return handler
