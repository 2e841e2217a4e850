"""The client's calls, sync and async over httpx, with one retry rule for both (``_retry_after``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from durable_sandbox.client.streaming import Output, async_events, sync_events
from durable_sandbox.client.wire import (
    RETRY_FOR,
    CallResult,
    SandboxCallError,
    SnapshotResult,
    _error_of,
    _operation_id,
    _retry_after,
    _Target,
    _target,
    _verify,
)
from durable_sandbox.shell_args import shell_args

__all__ = ["AsyncSandboxClient", "CallResult", "SandboxCallError", "SandboxClient", "SnapshotResult"]

class SandboxClient:
    """A Sandbox's calls, one at a time (blocking). ``attach`` names it; close it (or use ``with``)."""

    def __init__(self, target: _Target, *, verify: bool | str | None = None, retry_for: float = RETRY_FOR,
                 timeout: float = 3700.0, transport: httpx.BaseTransport | None = None) -> None:
        self.target = target
        self.retry_for = retry_for
        self._http = httpx.Client(verify=_verify(verify), timeout=timeout, transport=transport)

    @classmethod
    def attach(cls, name: str, *, namespace: str | None = None, url: str | None = None, token: str | None = None,
               kubeconfig: str | None = None, context: str | None = None, **options: Any) -> SandboxClient:
        return cls(_target(name, namespace, url, token, kubeconfig, context), **options)

    @classmethod
    def create_or_attach(cls, name: str, *, spec: dict[str, Any] | None = None, wait: float = 300.0,
                         namespace: str | None = None, url: str | None = None, token: str | None = None,
                         kubeconfig: str | None = None, context: str | None = None, **options: Any) -> SandboxClient:
        """Sandbox ``name``: created with ``spec`` (e.g. ``{"provider": "kubernetes"}``; needs create on sandboxes)
        unless it exists (then attached as it is), and waited for until Ready (``wait`` seconds; 0: not waited)."""
        box = cls.attach(name, namespace=namespace, url=url, token=token, kubeconfig=kubeconfig, context=context,
                         **options)
        try:
            _lifecycle_answer(box._http.put(box.target.path(), json={"spec": spec or {}}, headers=box.target.headers()))
            if wait:
                box.wait_ready(timeout=wait)
        except BaseException:
            box.close()
            raise
        return box

    def call(self, kind: str, body: dict[str, Any], operation_id: str | None = None) -> CallResult:
        """Send one call (``kind`` and its fields), retried with the same operation id until it is answered."""
        return CallResult.of(self.call_json(kind, body, operation_id))

    def call_json(self, kind: str, body: dict[str, Any], operation_id: str | None = None) -> dict[str, Any]:
        body = {**body, "operationId": _operation_id(operation_id)}
        started, attempt = time.monotonic(), 0
        while True:
            outcome: httpx.Response | Exception
            try:
                outcome = self._http.post(self.target.path(kind), json=body, headers=self.target.headers())
            except httpx.TransportError as exc:
                outcome = exc
            wait = _retry_after(outcome, attempt, started, self.retry_for)
            if wait is None:
                return _answer(outcome)
            time.sleep(wait)
            attempt += 1

    def run(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
            env: dict[str, str] | None = None, operation_id: str | None = None) -> CallResult:
        return self.call("shell", shell_args(command, timeout, cwd, env), operation_id)

    def stream(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
               env: dict[str, str] | None = None, operation_id: str | None = None) -> Iterator[Output | CallResult]:
        """:meth:`run`, its output yielded while it runs (``Output`` pieces), then its ``CallResult``."""
        body = {**shell_args(command, timeout, cwd, env), "operationId": _operation_id(operation_id)}
        return sync_events(self._http, self.target, body, self.retry_for)

    def snapshot(self, *, operation_id: str | None = None) -> SnapshotResult:
        """A snapshot of the Sandbox now, journaled (a loss restores it); the same id again: the same snapshot."""
        return SnapshotResult.of(self.call_json("snapshot", {}, operation_id))

    def write_file(self, path: str, contents: str, *, operation_id: str | None = None) -> CallResult:
        return self.call("write_file", {"path": path, "contents": contents}, operation_id)

    def read_file(self, path: str, *, operation_id: str | None = None) -> str:
        result = self.call("read_file", {"path": path}, operation_id)
        if result.exit_code != 0:
            raise FileNotFoundError(result.stderr.strip() or path)
        return result.stdout

    def list(self, path: str = ".", *, operation_id: str | None = None) -> list[str]:
        return _entries(self.call("list", {"path": path}, operation_id), path)

    def close(self) -> None:
        self._http.close()

    # The Sandbox's lifecycle, done by the call API with this client's token (the caller's own rights: patch or
    # delete on sandboxes, docs/agents.md); a refusal raises SandboxCallError.

    def state(self) -> dict[str, Any]:
        """The Sandbox's state: ``{name, uid, phase, ready, suspended}`` (needs get on sandboxes)."""
        return _lifecycle_answer(self._http.get(self.target.path(), headers=self.target.headers()))

    def suspend(self) -> dict[str, Any]:
        """Set spec.suspend: the Sandbox is snapshotted and its sandbox let go (needs patch on sandboxes)."""
        return _lifecycle_answer(self._http.post(self.target.path("suspend"), headers=self.target.headers()))

    def resume(self) -> dict[str, Any]:
        """Clear spec.suspend: the Sandbox is restored from its snapshot (wait for it with :meth:`wait_ready`)."""
        return _lifecycle_answer(self._http.post(self.target.path("resume"), headers=self.target.headers()))

    def rewind(self, to_call: int) -> dict[str, Any]:
        """Rewind the Sandbox's session to after its call ``to_call``: the calls after it are journaled as rewound
        (never deleted from its history) and the workspace rebuilt to hold exactly the first ``to_call``; the next
        call goes after them, under a new operation id (needs update on sandboxes). Asking again is harmless (it
        rewinds nothing more). Answers ``{toCall, rewound, sandboxId, replayed}``."""
        return _lifecycle_answer(self._http.post(self.target.path("rewind"), json={"toCall": to_call},
                                                 headers=self.target.headers()))

    def delete(self) -> None:
        """Delete the Sandbox (its sandbox, snapshots and call journal go with it; needs delete on sandboxes)."""
        _lifecycle_answer(self._http.delete(self.target.path(), headers=self.target.headers()))

    def wait_ready(self, timeout: float = 300.0, poll: float = 1.0) -> dict[str, Any]:
        """The Sandbox's state once it is Ready; TimeoutError (with its last phase) after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not (state := self.state())["ready"]:
            if time.monotonic() > deadline:
                raise TimeoutError(_not_ready(self.target, state, timeout))
            time.sleep(poll)
        return state

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncSandboxClient:
    """:class:`SandboxClient` on asyncio."""

    def __init__(self, target: _Target, *, verify: bool | str | None = None, retry_for: float = RETRY_FOR,
                 timeout: float = 3700.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.target = target
        self.retry_for = retry_for
        self._http = httpx.AsyncClient(verify=_verify(verify), timeout=timeout, transport=transport)

    @classmethod
    def attach(cls, name: str, *, namespace: str | None = None, url: str | None = None, token: str | None = None,
               kubeconfig: str | None = None, context: str | None = None, **options: Any) -> AsyncSandboxClient:
        return cls(_target(name, namespace, url, token, kubeconfig, context), **options)

    @classmethod
    async def create_or_attach(cls, name: str, *, spec: dict[str, Any] | None = None, wait: float = 300.0,
                               namespace: str | None = None, url: str | None = None, token: str | None = None,
                               kubeconfig: str | None = None, context: str | None = None,
                               **options: Any) -> AsyncSandboxClient:
        box = cls.attach(name, namespace=namespace, url=url, token=token, kubeconfig=kubeconfig, context=context,
                         **options)
        try:
            _lifecycle_answer(await box._http.put(box.target.path(), json={"spec": spec or {}},
                                                  headers=box.target.headers()))
            if wait:
                await box.wait_ready(timeout=wait)
        except BaseException:
            await box.aclose()
            raise
        return box

    async def call(self, kind: str, body: dict[str, Any], operation_id: str | None = None) -> CallResult:
        return CallResult.of(await self.call_json(kind, body, operation_id))

    async def call_json(self, kind: str, body: dict[str, Any], operation_id: str | None = None) -> dict[str, Any]:
        body = {**body, "operationId": _operation_id(operation_id)}
        started, attempt = time.monotonic(), 0
        while True:
            outcome: httpx.Response | Exception
            try:
                outcome = await self._http.post(self.target.path(kind), json=body, headers=self.target.headers())
            except httpx.TransportError as exc:
                outcome = exc
            wait = _retry_after(outcome, attempt, started, self.retry_for)
            if wait is None:
                return _answer(outcome)
            await asyncio.sleep(wait)
            attempt += 1

    async def run(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
                  env: dict[str, str] | None = None, operation_id: str | None = None) -> CallResult:
        return await self.call("shell", shell_args(command, timeout, cwd, env), operation_id)

    def stream(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
               env: dict[str, str] | None = None, operation_id: str | None = None) -> AsyncIterator[Output | CallResult]:
        """``async for piece in box.stream(...)``: its output while it runs (``Output``), then its ``CallResult``."""
        body = {**shell_args(command, timeout, cwd, env), "operationId": _operation_id(operation_id)}
        return async_events(self._http, self.target, body, self.retry_for)

    async def snapshot(self, *, operation_id: str | None = None) -> SnapshotResult:
        return SnapshotResult.of(await self.call_json("snapshot", {}, operation_id))

    async def write_file(self, path: str, contents: str, *, operation_id: str | None = None) -> CallResult:
        return await self.call("write_file", {"path": path, "contents": contents}, operation_id)

    async def read_file(self, path: str, *, operation_id: str | None = None) -> str:
        result = await self.call("read_file", {"path": path}, operation_id)
        if result.exit_code != 0:
            raise FileNotFoundError(result.stderr.strip() or path)
        return result.stdout

    async def list(self, path: str = ".", *, operation_id: str | None = None) -> list[str]:
        return _entries(await self.call("list", {"path": path}, operation_id), path)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def state(self) -> dict[str, Any]:
        return _lifecycle_answer(await self._http.get(self.target.path(), headers=self.target.headers()))

    async def suspend(self) -> dict[str, Any]:
        return _lifecycle_answer(await self._http.post(self.target.path("suspend"), headers=self.target.headers()))

    async def resume(self) -> dict[str, Any]:
        return _lifecycle_answer(await self._http.post(self.target.path("resume"), headers=self.target.headers()))

    async def rewind(self, to_call: int) -> dict[str, Any]:
        return _lifecycle_answer(await self._http.post(self.target.path("rewind"), json={"toCall": to_call},
                                                       headers=self.target.headers()))

    async def delete(self) -> None:
        _lifecycle_answer(await self._http.delete(self.target.path(), headers=self.target.headers()))

    async def wait_ready(self, timeout: float = 300.0, poll: float = 1.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not (state := await self.state())["ready"]:
            if time.monotonic() > deadline:
                raise TimeoutError(_not_ready(self.target, state, timeout))
            await asyncio.sleep(poll)
        return state

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


def _answer(outcome: httpx.Response | Exception) -> dict[str, Any]:
    if isinstance(outcome, Exception):
        raise outcome
    if outcome.status_code >= 400:
        raise _error_of(outcome)
    return dict(outcome.json())


def _entries(result: CallResult, path: str) -> list[str]:
    if result.exit_code != 0:
        raise FileNotFoundError(result.stderr.strip() or path)
    return [line for line in result.stdout.splitlines() if line]


def _lifecycle_answer(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise _error_of(response)
    return dict(response.json())


def _not_ready(target: _Target, state: dict[str, Any], timeout: float) -> str:
    return (f"Sandbox {target.namespace}/{target.name} was not Ready after {timeout:g}s (phase "
            f"{state.get('phase') or 'Pending'}{', suspended' if state.get('suspended') else ''}); `kubectl describe "
            f"dsbx {target.name} -n {target.namespace}` says what it waits for")
