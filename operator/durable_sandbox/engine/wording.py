"""Counts in the words people read: "1 call", "2 calls" (the CLI, the web view, progress messages)."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int | str, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, the noun plural unless ``n`` is 1 (``plural`` for an irregular one); a count that
    is not a number (``"?"``: unknown) takes the plural."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
