"""Driving an async step function's coroutine by hand: its first stretch at once, the rest in the task.

An async step function often completes without ever suspending (glue code, a cache lookup, a no-op):
run to its first suspension point inside the step itself, it either completes there, and the step can
commit its start and its outcome in one commit as a quick sync step does (nothing else in this process
ran in between, so nothing could have seen the start), or it yields what it waits for, and the step
commits its start before letting it go on (``Rest`` hands that yielded future to the running task and
relays whatever the task sends or throws back, exactly as ``await`` would have).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any


def first_stretch(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
    """Run ``coro`` up to its first suspension: ``(True, result)`` if it completed, ``(False, yielded)`` if it
    suspended (``yielded`` is what it waits for; await ``Rest(coro, yielded)`` to go on). An exception of the
    function propagates, as from ``await``."""
    try:
        yielded = coro.send(None)
    except StopIteration as done:
        return True, done.value
    return False, yielded


class Rest:
    """The rest of a coroutine that ``first_stretch`` left suspended on ``yielded``: awaiting it (in any task)
    continues the coroutine there, as if it had been awaited from its start."""

    __slots__ = ("_coro", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, yielded = self._coro, self._yielded
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation (or anything else) thrown into the task
                try:
                    yielded = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as done:
                    return done.value
