"""One namespace's run heads in memory, written by the store's own code (``kube/store/runs.py``: sealed as the
operator seals them), for the tests of what reads heads back (``tests/unit/kube/test_sweep_sealed_runs.py``)."""

from __future__ import annotations

import copy
from typing import Any

from durable_sandbox.engine.continue_as_new import CHAIN, CONTINUED_FROM, GENERATION, RESULT_KEY
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.kube.api.client import ApiException
from durable_sandbox.kube.journal.sealing import Sealer
from durable_sandbox.kube.store.blobs import Blobs
from durable_sandbox.kube.store.codec import head_name
from durable_sandbox.kube.store.heads import RunHeads
from durable_sandbox.kube.store.runs import Runs

NS = "team-a"
KEY = b"k" * 32  # the operator's journal key in these tests


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


class MemoryObjects:
    """Journal objects of one namespace: create, get (each name read is kept in ``gets``), list by equality
    selectors and JSON Patch ``add``/``test`` of ``data`` keys and labels, as the API server does them."""

    def __init__(self, namespace: str = NS) -> None:
        self.namespace = namespace
        self.bodies: dict[str, dict[str, Any]] = {}
        self.gets: list[str] = []

    async def get(self, name: str) -> dict[str, Any] | None:
        self.gets.append(name)
        return copy.deepcopy(self.bodies.get(name))

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name in self.bodies:
            raise ApiException(status=409)
        self.bodies[name] = copy.deepcopy(body)
        return copy.deepcopy(body)

    async def select(self, selector: str) -> list[dict[str, Any]]:
        """The objects matching ``selector``'s ``key=value`` terms (the only kind the readers here use)."""
        terms = dict(term.split("=", 1) for term in selector.split(","))
        return [copy.deepcopy(b) for b in self.bodies.values()
                if all((b["metadata"].get("labels") or {}).get(k) == v for k, v in terms.items())]

    async def patch(self, name: str, ops: list[dict[str, Any]]) -> None:
        if name not in self.bodies:
            raise ApiException(status=404)
        body = self.bodies[name]
        for op in ops:
            *parents, leaf = [_unescape(p) for p in op["path"].split("/")[1:]]
            target = body
            for part in parents:
                target = target.setdefault(part, {})
            if op["op"] == "test" and target.get(leaf) != op["value"]:
                raise ApiException(status=422)
            if op["op"] in ("add", "replace"):
                target[leaf] = op["value"]


class NoLeases:
    async def read(self, name: str) -> None:
        return None


class Journal:
    """The run heads of namespace ``NS`` as the operator writes them (``sealer``: its key, or another's)."""

    def __init__(self, sealer: Sealer | None = None) -> None:
        self.objects = MemoryObjects()
        self.heads = RunHeads(self.objects, sealer or Sealer(KEY, NS), Blobs(self.objects))  # type: ignore[arg-type]
        self.runs = Runs(self.heads, NoLeases())  # type: ignore[arg-type]

    async def run(self, run_id: str, status: RunStatus = RunStatus.RUNNING, *, result: Any = None,
                  labels: dict[str, str] | None = None) -> dict[str, Any]:
        """A run created, then its status (and result) changed as the engine's commits change them; its head."""
        await self.runs.create_run(RunRecord(run_id=run_id, workflow="wf", input=None, labels=labels or {}))
        if status != RunStatus.PENDING:
            await self.runs.update_run(run_id, {"status": status, "result": result})
        return self.head(run_id)

    async def chain(self, first: str, *ends: RunStatus) -> list[str]:
        """A chain that continued as new ``len(ends) - 1`` times: each run but the last ended by continuing, the
        last's status is ``ends[-1]`` (engine/continue_as_new.py's labels and result)."""
        ids = [first] + [f"{first}~{n}" for n in range(1, len(ends))]
        for n, run_id in enumerate(ids):
            labels = {CONTINUED_FROM: ids[n - 1], CHAIN: first, GENERATION: str(n)} if n else {}
            last = n == len(ids) - 1
            await self.run(run_id, ends[n] if last else RunStatus.SUCCEEDED,
                           result=None if last else {RESULT_KEY: ids[n + 1]}, labels=labels)
        return ids

    def head(self, run_id: str) -> dict[str, Any]:
        return copy.deepcopy(self.objects.bodies[head_name(run_id)])

    def put(self, body: dict[str, Any]) -> None:
        """Write an object as anyone who may write Journal objects can (no seal involved)."""
        self.objects.bodies[body["metadata"]["name"]] = copy.deepcopy(body)
