"""Keeping credentials out of what is printed: every URL shown to a person goes through :func:`redact_url`."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"

# Query parameters that carry credentials in the URLs people configure (presigned URLs, tokens in links).
_SECRET_PARAMS = ("token", "key", "secret", "password", "passwd", "pwd", "sig", "signature", "auth", "credential")


def redact_url(url: str) -> str:
    """``url`` with its userinfo (``user:password@``) and credential-like query values replaced by ``***``.

    Anything that does not parse as a URL is returned as ``***`` rather than risk echoing a secret."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{host}{port}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret_param(k) for k, _ in pairs):
            query = urlencode([(k, REDACTED if _secret_param(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _secret_param(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_PARAMS)


__all__ = ["REDACTED", "redact_url"]
