"""Label values derived from names: a label value is at most 63 characters of ``[A-Za-z0-9._-]``, starting and
ending with an alphanumeric, while the names copied into labels (a Sandbox's, up to 253 characters) need not be.
A value that would be refused is replaced by a readable prefix and a digest of the whole, so the API server
never refuses an object the operator needs (a Sandbox's lease: without it, no cleanup and a stuck finalizer)."""

from __future__ import annotations

import hashlib
import re

__all__ = ["label_value"]

_VALID = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")


def label_value(text: str) -> str:
    """``text`` when it is a valid label value, else ``<prefix>-<12 hex of sha256(text)>`` (at most 63)."""
    if _VALID.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    prefix = re.sub(r"[^A-Za-z0-9._-]", "-", text[:50]).strip("-_.")
    return f"{prefix}-{digest}" if prefix else digest
