"""A Workflow run's queries and updates through the call API (sessions/workflow_calls.py), blocking, over httpx.

    from durable_sandbox.client import WorkflowClient

    with WorkflowClient.attach("budget", namespace="demo", url="https://durable-sandbox.example:8443") as wf:
        print(wf.query("remaining"))
        print(wf.update("raise", {"amount": 5}, update_id="raise-1"))

An update carries an update id (made for it unless given) and is sent again with the same id after a lost
connection or a retryable refusal (another replica executing the run) until it is answered: the Workflow's
journal applies it once. A refusal raises ``SandboxCallError`` with the server's status and what/where/do.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

from durable_sandbox.client.wire import RETRY_FOR, _error_of, _retry_after, _Target, _target, _verify

__all__ = ["WorkflowClient"]


class WorkflowClient:
    """Queries and updates of Workflow ``name``'s run (its caller's token: ``get`` on it to query, ``update`` to
    update). ``attach`` names it; close it (or use ``with``)."""

    def __init__(self, target: _Target, *, verify: bool | str | None = None, retry_for: float = RETRY_FOR,
                 timeout: float = 120.0, transport: httpx.BaseTransport | None = None) -> None:
        self.target = target
        self.retry_for = retry_for
        self._http = httpx.Client(verify=_verify(verify), timeout=timeout, transport=transport)

    @classmethod
    def attach(cls, name: str, *, namespace: str | None = None, url: str | None = None, token: str | None = None,
               kubeconfig: str | None = None, context: str | None = None, **options: Any) -> WorkflowClient:
        return cls(_target(name, namespace, url, token, kubeconfig, context), **options)

    def _path(self, what: str, handler: str) -> str:
        t = self.target
        return f"{t.url.rstrip('/')}/v1/namespaces/{t.namespace}/workflows/{t.name}/{what}/{handler}"

    def query(self, name: str, arg: Any = None) -> Any:
        """The answer of the run's query handler ``name`` (answered from its journal; nothing is written)."""
        return self.ask("queries", name, {"arg": arg})["answer"]

    def update(self, name: str, input: Any = None, *, update_id: str | None = None) -> Any:
        """The result of the run's update handler ``name`` on ``input``, applied once per ``update_id``."""
        return self.ask("updates", name, {"input": input, "updateId": update_id or self.new_id()})["result"]

    @staticmethod
    def new_id() -> str:
        return f"u-{uuid.uuid4().hex}"

    def ask(self, what: str, handler: str, body: dict[str, Any]) -> dict[str, Any]:
        """The whole answer (``runId`` and the rest) of ``queries``/``updates`` ``handler``, sent again (the same
        body, so the same update id) after a lost connection or a retryable refusal until it is answered."""
        url = self._path(what, handler)
        started, attempt = time.monotonic(), 0
        while True:
            outcome: httpx.Response | Exception
            try:
                outcome = self._http.post(url, json=body, headers=self.target.headers())
            except httpx.TransportError as exc:
                outcome = exc
            wait = _retry_after(outcome, attempt, started, self.retry_for)
            if wait is None:
                if isinstance(outcome, Exception):
                    raise outcome
                if outcome.status_code >= 400:
                    raise _error_of(outcome)
                return dict(outcome.json())
            time.sleep(wait)
            attempt += 1

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> WorkflowClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
