"""Sync step functions with a timeout: each attempt in a daemon thread of its own, abandoned at the timeout.

Python cannot stop a thread. A step whose function outlives its ``timeout=`` fails at the timeout
(``StepTimeout``; retried if its policy allows) and the run moves on; the function goes on running in
its thread until it returns, and what it returns then is dropped (the attempt's outcome, the timeout, is
what the journal records). The thread is a daemon outside every executor on purpose: ``asyncio.run``
joins the loop's default executor when it ends and ``concurrent.futures`` joins its pools' threads at
interpreter exit, so a step run there would keep ``dsb run`` (or any embedder) alive until a function
that may never return does. Nothing waits for these threads; the process exits over them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any

THREAD_NAME_PREFIX = "dsb-step:"  # "dsb-step:<op id>#<attempt>", for thread dumps and tests


def run_abandonable(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
                    name: str) -> asyncio.Future[Any]:
    """Start ``fn(*args, **kwargs)`` in a daemon thread; the future gets its outcome unless it is done
    (cancelled by a timeout) first, in which case the outcome is dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, outcome: Any) -> None:  # on the loop
        if future.done():
            return  # abandoned at its timeout: a late result reaches nothing
        if ok:
            future.set_result(outcome)
        else:
            future.set_exception(outcome)

    def target() -> None:
        try:
            ok, outcome = True, fn(*args, **kwargs)
        except Exception as exc:
            ok, outcome = False, exc
        # The loop may be closed by now (the run ended, the process is exiting): then nobody listens.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, ok, outcome)

    # As asyncio.to_thread does: the function sees the caller's context variables.
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(target,), name=THREAD_NAME_PREFIX + name, daemon=True).start()
    return future
