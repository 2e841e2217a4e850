"""An API server's refusal as ``dsb --kube`` says it: one ``error:`` line that names what was refused and what
to do, never the client's multi-line exception dump (status, headers, the raw JSON body).

Duck-typed on the official client's ``ApiException`` (``status``, ``reason``, ``body``) so this module, which
the CLI's error handler imports, needs no ``kubernetes`` package: without the extra nothing raises one."""

from __future__ import annotations

import json
from typing import Any

from durable_sandbox.runs.errors import EXIT_FAILED, EXIT_USAGE

__all__ = ["api_refusal"]


def _status(exc: BaseException) -> dict[str, Any]:
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        doc = json.loads(body) if isinstance(body, str) else None
    except ValueError:
        doc = None
    return doc if isinstance(doc, dict) else {}


def api_refusal(exc: BaseException, namespace: str | None = None) -> tuple[str, int] | None:
    """(one line, exit code) for an API server's answer; None for any other exception. A request the server
    refuses (4xx: a missing namespace, a forbidden verb, an invalid object) is bad input, exit 2; the server
    failing (429, 5xx) is exit 1."""
    if type(exc).__name__ != "ApiException" or not isinstance(getattr(exc, "status", None), int):
        return None
    status: int = exc.status  # type: ignore[attr-defined]
    doc = _status(exc)
    message = " ".join(str(doc.get("message") or getattr(exc, "reason", "") or "").split())
    raw = doc.get("details")
    details: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if status == 404 and details.get("kind") == "namespaces":
        name = details.get("name") or namespace
        return (f"{message}: create it (`kubectl create namespace {name}`) or choose another with -n", EXIT_USAGE)
    what = f"the API server answered {status} {doc.get('reason') or getattr(exc, 'reason', '')}".rstrip()
    if status == 403:
        return f"{what}: {message} (ask for the RBAC rights, or use a kubeconfig that has them)", EXIT_USAGE
    if 400 <= status < 500 and status != 429:
        return f"{what}: {message}", EXIT_USAGE
    return f"{what}: {message}; try again once the API server is back", EXIT_FAILED
