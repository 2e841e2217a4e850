"""Errors the Workflow and the Sandbox controllers share with the kopf handlers (``kube/handlers.py``)."""

from __future__ import annotations

__all__ = ["CleanupPending"]


class CleanupPending(Exception):
    """Cleanup cannot finish yet (the provider refuses, or another replica executes the run); retry later.

    The delete handler turns it into kopf's temporary error with ``delay``, so the finalizer stays."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay
