"""Where a sandbox call is made from, so that its default operation id is stable across a resume.

A session names a call made by the workflow's own code after its place among those calls (``derived_operation_id``):
the workflow re-issues them in order on every execution. A call made inside a journaled step (an agent's tool,
``DurableAgentRun.tool_call``) is not re-issued when that step is replayed from the journal, so a name from an
execution-order counter would shift every later call. Such a step opens a *call scope* named after its own op id; a
call made in it without an explicit operation id is named ``<step op id>/sbx/<k>`` (k = 1, 2, ... in the order the
step makes its calls), the same in every execution that runs the step, whatever was replayed before it.

The scope is a context variable: concurrent tools (each its own task) each see their own; a task a tool starts
inherits the tool's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

SEPARATOR = "sbx"  # <step op id>/sbx/<k>


class CallScope:
    """The sandbox calls of one journaled step (one execution of it): numbered in the order it makes them."""

    def __init__(self, owner: str) -> None:
        self.owner = owner  # the step's op id
        self.made = 0

    def next_operation_id(self) -> str:
        self.made += 1
        return f"{self.owner}/{SEPARATOR}/{self.made}"


_current: ContextVar[CallScope | None] = ContextVar("durable_sandbox_call_scope", default=None)


@contextlib.contextmanager
def call_scope(owner: str) -> Iterator[CallScope]:
    """Sandbox calls made (without an operation id) inside the block are named ``<owner>/sbx/<k>``."""
    scope = CallScope(owner)
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)


def current_call_scope() -> CallScope | None:
    return _current.get()


__all__ = ["SEPARATOR", "CallScope", "call_scope", "current_call_scope"]
