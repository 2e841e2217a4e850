"""Where one session call's time goes inside the operator: ``dsb`` run with timing wrappers around each phase.

    python benchmarks/session_phase_timer.py OUT.json -- operator --allow-local-provider -n NS --session-port ...

It is ``dsb`` (the same arguments) with the phases of a session call timed by wrappers installed before it starts,
and every finished call's phases written to ``OUT.json`` (rewritten by a thread every half second, so no write is
on a call's path). Used by ``session_call_phases.py``; nothing in the operator knows of it.

The phases of one call (``SessionService.call`` is the whole, in the operator):
``auth`` the TokenReview/SubjectAccessReview check (``KubeAuthorizer.check``: cached per token digest), with
``token_review`` and ``access_review`` the API requests it made (none while the cache holds); ``find`` the Sandbox
read by name (its uid); ``commit_1``, ``commit_2``, ... the journal's fenced commits in their order (for a
``write_file``: the ``started`` record, then the ``completed`` one), each with ``patch_N`` its API request alone;
``provider`` the provider's own call (``SandboxSession._execute``). The rest of ``total`` is the session's own
work (turn, hold, rebuild check, records built).
"""

from __future__ import annotations

import contextvars
import functools
import json
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

_CALL: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("phase_call", default=None)


def _timed(cls: type, attr: str, phase: str | Callable[[dict[str, float]], str]) -> None:
    """``cls.attr`` (async) timed into the current call's ``phase`` (a name, or one chosen from the call so far)."""
    inner: Callable[..., Awaitable[Any]] = getattr(cls, attr)

    @functools.wraps(inner)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _CALL.get()
        if call is None:
            return await inner(*args, **kwargs)
        name = phase if isinstance(phase, str) else phase(call)
        started = time.perf_counter()
        try:
            return await inner(*args, **kwargs)
        finally:
            call[name] = call.get(name, 0.0) + time.perf_counter() - started

    setattr(cls, attr, wrapper)


def _nth(prefix: str) -> Callable[[dict[str, float]], str]:
    """The next unused ``prefix_N`` of the call (the Nth commit, the Nth PATCH)."""
    return lambda call: f"{prefix}_{sum(1 for k in call if k.startswith(prefix + '_')) + 1}"


def install(out: Path) -> None:
    from kubernetes.aio import client as k8s

    from durable_sandbox.kube.journal.journal_objects import JournalObjects
    from durable_sandbox.kube.store.commits import Commits
    from durable_sandbox.sandboxes.session import SandboxSession
    from durable_sandbox.sessions.kube_auth import KubeAuthorizer
    from durable_sandbox.sessions.kube_gate import KubeSandboxGate
    from durable_sandbox.sessions.service import SessionService

    calls: list[dict[str, float]] = []
    whole = SessionService.call

    @functools.wraps(whole)
    async def call(*args: Any, **kwargs: Any) -> Any:
        phases: dict[str, float] = {}
        token = _CALL.set(phases)
        started = time.perf_counter()
        try:
            return await whole(*args, **kwargs)
        finally:
            phases["total"] = time.perf_counter() - started
            _CALL.reset(token)
            calls.append(phases)

    SessionService.call = call  # type: ignore[method-assign]
    _timed(KubeAuthorizer, "check", "auth")
    _timed(k8s.AuthenticationV1Api, "create_token_review", "token_review")
    _timed(k8s.AuthorizationV1Api, "create_subject_access_review", "access_review")
    _timed(KubeSandboxGate, "find", "find")
    _timed(Commits, "commit", _nth("commit"))
    _timed(JournalObjects, "patch", _nth("patch"))
    _timed(SandboxSession, "_execute", "provider")

    def dump() -> None:
        written = -1
        while True:
            time.sleep(0.5)
            if len(calls) != written:
                written = len(calls)
                tmp = out.with_suffix(".tmp")
                tmp.write_text(json.dumps(calls[:written]))
                tmp.replace(out)

    threading.Thread(target=dump, daemon=True, name="phase-dump").start()


def main() -> None:
    out, rest = Path(sys.argv[1]), sys.argv[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    install(out)
    from durable_sandbox.cli.main import main as dsb

    sys.argv = ["dsb", *rest]
    dsb()


if __name__ == "__main__":
    main()
