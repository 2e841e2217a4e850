"""Signals of a run (approvals, callbacks): one sealed map in its head, each id written once (the same value again
is a no-op, another value a conflict), by a patch that ``test``s the map it read."""

from __future__ import annotations

from typing import Any

from durable_sandbox.engine.errors import RunNotFound, SignalConflict
from durable_sandbox.kube.api.client import ApiException, is_not_found, is_precondition_failed
from durable_sandbox.kube.store.codec import RETRIES, canonical, dumps, head_name, run_key
from durable_sandbox.kube.store.heads import RunHeads


class RunSignals:
    """The signals of one namespace's runs."""

    def __init__(self, heads: RunHeads) -> None:
        self.heads = heads
        self.objects = heads.objects

    async def put_signal(self, run_id: str, callback_id: str, value: Any) -> bool:
        key = run_key(run_id)
        sealed = self.heads.sealed
        for _ in range(RETRIES):
            head = await self.objects.get(head_name(run_id))
            if head is None:
                raise RunNotFound(run_id)
            current = (head.get("data") or {}).get("signals")
            signals = dict(self.heads.loads(run_id, key, head.get("data") or {}, "signals", head["metadata"]["name"],
                                            "{}"))
            if callback_id in signals:
                if canonical(signals[callback_id]) == canonical(value):
                    return False
                raise SignalConflict(run_id, callback_id)
            signals[callback_id] = value
            ops = [{"op": "test", "path": "/data/signals", "value": current} if current is not None
                   else {"op": "add", "path": "/data/signals", "value": sealed(key, "signals", "{}")},
                   {"op": "replace", "path": "/data/signals", "value": sealed(key, "signals", dumps(signals))}]
            try:
                await self.objects.patch(head["metadata"]["name"], ops)
            except ApiException as exc:
                if is_precondition_failed(exc):
                    continue  # another signal landed first: read again
                if is_not_found(exc):
                    raise RunNotFound(run_id) from None
                raise
            return True
        raise RuntimeError(f"Could not store signal {callback_id!r} of run {run_id!r}: too many concurrent signals")

    async def get_signals(self, run_id: str) -> dict[str, Any]:
        key = run_key(run_id)
        head = await self.objects.get(head_name(run_id))
        if head is None:
            return {}
        return dict(self.heads.loads(run_id, key, head.get("data") or {}, "signals", head["metadata"]["name"], "{}"))
