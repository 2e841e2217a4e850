"""Keeping secret values off the page: every value the web view renders from a run goes through :func:`redact`.

What the store holds is already free of the secrets the project knows about (a Workflow's env values are
replaced by ``***`` before a run is recorded; a call's ``env`` is never journaled; provider handles carry no
credentials). This is the second line: a run's input, a callback's payload, a step's result or a handle
written by other code may still carry one, so the view masks

- every value of an ``env`` mapping, and the ``value`` of every ``{name, value}`` item of an ``env`` list
  (a ``valueFrom`` reference names a Secret; it is not one, and stays);
- every string value under a key that names a credential (``token``, ``secret``, ``password``,
  ``apiKey``, ``credential``, ``authorization``, ``privateKey``, ``accessKey``, ...): only strings, so
  counters such as an agent's ``inputTokens`` stay readable;
- userinfo and credential-like query parameters of URLs (``providers.redaction.redact_url``).

Tool output (stdout, stderr) is shown as the CLI shows it: a program that prints a secret prints it into
its own journal, which ``dsb history`` shows too.
"""

from __future__ import annotations

import re
from typing import Any

from durable_sandbox.providers.redaction import REDACTED, redact_url

__all__ = ["REDACTED", "is_secret_key", "redact"]

_SECRET_KEY = re.compile(
    r"(secret|token|passw|pwd|api[_-]?key|credential|authorization|private[_-]?key|access[_-]?key|session[_-]?key)",
    re.IGNORECASE,
)
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_MAX_DEPTH = 64  # deeper values are cut rather than walked (a page must render whatever a run recorded)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def redact(value: Any, *, _depth: int = 0) -> Any:
    """A copy of ``value`` (JSON data) with secret values replaced by ``***``."""
    if _depth > _MAX_DEPTH:
        return "…"
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = str(key)
            if name.lower() == "env":
                out[name] = _redact_env(item, _depth)
            elif is_secret_key(name) and isinstance(item, str) and item:
                out[name] = REDACTED
            else:
                out[name] = redact(item, _depth=_depth + 1)
        return out
    if isinstance(value, list):
        return [redact(item, _depth=_depth + 1) for item in value]
    if isinstance(value, str) and _URL.match(value):
        return redact_url(value)
    return value


def _redact_env(env: Any, depth: int) -> Any:
    if isinstance(env, dict):
        return {str(k): REDACTED if v not in (None, "") else v for k, v in env.items()}
    if isinstance(env, list):
        items: list[Any] = []
        for item in env:
            if isinstance(item, dict):
                masked = {k: (REDACTED if k == "value" and v not in (None, "") else redact(v, _depth=depth + 1))
                          for k, v in item.items()}
                items.append(masked)
            else:
                items.append(REDACTED)
        return items
    return REDACTED if env not in (None, "") else env
