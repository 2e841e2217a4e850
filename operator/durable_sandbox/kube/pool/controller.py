"""Reconciliation of ``SandboxPool`` resources, without kopf: keep ``spec.size`` warm Pods of the pool's PodTemplate.

kopf (``kube/handlers.py``) runs :meth:`PoolController.daemon` once per pool, :meth:`notice` on every watch event
and :meth:`cleanup` from the delete handler behind the ``durable-sandbox.dev/cleanup`` finalizer.

One turn (every ``poll`` seconds, sooner while Pods start, at once on a spec change): read the PodTemplate as a
provision would (the operator's policy applied: a pool never holds a Pod a provision would refuse), list the Pods
labelled with the pool, plan (``providers/kubernetes_pool.py``: pure), then delete what the plan says (Pods of an
older template hash: the roll; ended ones; past the size), make running starters warm (the image probe, then the
warm seal) and create what is missing. Status (``ready``, ``starting``, ``claimed``, ``total``, a ``Ready``
condition) is written only when it changes. The PodTemplate is re-read every turn, so editing it rolls the pool
within a turn.

One replica at a time: the turn runs only in the replica holding the pool's lease (``dsbpool.<uid>``, a Journal
object as for Sandboxes, ``kube/journal/leases.py``); claims need no lease (they are conditional writes, any replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from durable_sandbox.kube.api.client import KubeClient, brief
from durable_sandbox.kube.api.objects import ObjectView
from durable_sandbox.kube.api.resources import API_VERSION, OPERATOR_FIELD_MANAGER, POOLS, CustomObjects
from durable_sandbox.kube.journal.leases import HeldLease, LeaseBusy, ObjectLeases
from durable_sandbox.kube.spec.conditions import State, merge
from durable_sandbox.kube.spec.models import SandboxPoolSpec
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.providers.contract import ProviderError
from durable_sandbox.providers.kubernetes_pool import WARM, PoolPlan, PoolPod, plan_pool, template_hash

log = logging.getLogger(__name__)

__all__ = ["PoolController", "PoolSettings"]

POOL_LEASE_LABEL = "durable-sandbox.dev/sandboxpool"
_CONCURRENT_CREATES = 10


@dataclass
class PoolSettings:
    poll: float = 1.0  # a full pool looks again this often (refill after a claim, a PodTemplate edit)
    starting_poll: float = 0.25  # while Pods start
    retry: float = 5.0  # after an error (the API server, a refused template)
    worker_id: str = "durable-sandbox"
    lease_ttl: float = 15.0


@dataclass(kw_only=True)
class PoolView(ObjectView):
    lease: HeldLease | None = None
    status: dict[str, Any] = field(default_factory=dict)  # as last written by this replica
    ignored: set[str] = field(default_factory=set)  # forged Pods already reported (once each, not every turn)


class PoolController:
    """``provider`` makes the kubernetes provider (with the operator's pool key) for the pools' Pods; None when
    it is off in this operator (every pool then says so in its Ready condition)."""

    def __init__(self, api: KubeClient, provider: Callable[[], Any] | None, metrics: OperatorMetrics,
                 settings: PoolSettings | None = None) -> None:
        self.api = api
        self.objects = CustomObjects(api, field_manager=OPERATOR_FIELD_MANAGER)
        self._make_provider = provider
        self._provider: Any = None
        self.metrics = metrics
        self.settings = settings or PoolSettings()
        self._views: dict[str, PoolView] = {}
        self._leases = ObjectLeases(api, field_manager=OPERATOR_FIELD_MANAGER, api_version=API_VERSION,
                                    kind="SandboxPool", prefix="dsbpool", name_label=POOL_LEASE_LABEL)

    async def aclose(self) -> None:
        provider, self._provider = self._provider, None
        if provider is not None:
            with contextlib.suppress(Exception):
                await provider.aclose()

    def provider(self) -> Any:
        if self._provider is None and self._make_provider is not None:
            self._provider = self._make_provider()
        return self._provider

    def notice(self, body: Mapping[str, Any]) -> None:
        view = self._views.get(body.get("metadata", {}).get("uid", ""))
        if view is not None:
            view.notice(body)

    # ------------------------------------------------------------------ daemon

    async def daemon(self, body_of: Callable[[], Mapping[str, Any]], stopped: asyncio.Event) -> None:
        body = body_of()
        meta = body["metadata"]
        view = self._views.setdefault(meta["uid"], PoolView(namespace=meta["namespace"], name=meta["name"],
                                                            uid=meta["uid"], body=body, body_of=body_of,
                                                            status=dict(body.get("status") or {})))
        try:
            while not stopped.is_set() and not view.deleting:
                view.wake.clear()
                delay = await self._hold(view)
                if delay is None:
                    delay = await self._turn(view)
                await view.wait(stopped, delay)
        finally:
            self._views.pop(view.uid, None)
            if view.lease is not None and view.lease.held and not view.deleting:
                with contextlib.suppress(Exception):
                    await view.lease.release()  # hand it over at once (SIGTERM, rolling update)
            self.metrics.forget_pool(view.namespace, view.name)

    async def _hold(self, view: PoolView) -> float | None:
        if view.lease is None:
            view.lease = self._leases.lease(view.namespace, view.name, view.uid, holder=self.settings.worker_id,
                                            ttl=self.settings.lease_ttl)
        if view.lease.held:
            return None
        try:
            await view.lease.take()
        except LeaseBusy as busy:
            return max(0.5, min(busy.remaining, self.settings.lease_ttl))
        except Exception as exc:
            log.warning("pool %s/%s: cannot take its lease: %s", view.namespace, view.name, brief(exc))
            return self.settings.retry
        return None

    async def _turn(self, view: PoolView) -> float:
        body = view.latest()
        generation = body.get("metadata", {}).get("generation")
        view.generation = generation
        try:
            spec = SandboxPoolSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            await self._status(view, None, generation, (False, "InvalidSpec", str(exc).splitlines()[0]))
            return self.settings.retry
        provider = self.provider()
        if provider is None:
            await self._status(view, None, generation, (False, "ProviderUnavailable",
                                                        "the kubernetes provider is off in this operator "
                                                        "(the chart's providers.kubernetes)"))
            return self.settings.retry
        try:
            template = await provider.pool_template(view.namespace, spec.template)
        except ProviderError as exc:
            await self._status(view, None, generation, (False, "TemplateInvalid", str(exc)))
            return self.settings.retry
        thash = template_hash(template)
        try:
            plan, pods = await self._plan(provider, view, spec, template)
            await self._act(provider, view, template, plan, pods)
        except Exception as exc:  # the API server or the node: said in status, tried again
            log.warning("pool %s/%s: %s", view.namespace, view.name, brief(exc))
            await self._status(view, None, generation, (False, "ReconcileError", brief(exc)))
            return self.settings.retry
        ready = plan.ready >= spec.size
        await self._status(view, plan, generation, (ready, "Full" if ready else "Filling",
                                                     f"{plan.ready} of {spec.size} Pods ready"), thash=thash)
        return self.settings.poll if not (plan.starting or plan.create) else self.settings.starting_poll

    async def _plan(self, provider: Any, view: PoolView, spec: SandboxPoolSpec,
                    template: Any) -> tuple[PoolPlan, dict[str, dict[str, Any]]]:
        from durable_sandbox.providers.kubernetes import HOPELESS_WAITING

        pods = {p["metadata"]["name"]: p for p in await provider.pool_pods(view.namespace, view.name)}
        manifest = template.pod(name="", namespace="", labels={}, annotations={}, env_secret=None)
        seen = {p.name: p for p in (PoolPod.of(body, provider.pool_key, view.name, hopeless=HOPELESS_WAITING,
                                               manifest=manifest) for body in pods.values())}
        plan = plan_pool(list(seen.values()), size=spec.size, thash=template_hash(template))
        for name in set(plan.ignored) - view.ignored:  # said once each (a log line, a Warning Event on the Pod)
            why = (f"its spec is not the pool's template's ({seen[name].refusal})" if seen[name].refusal
                   else "it has the pool's label but not the operator's seal")
            await provider.refuse_pool_pod(pods[name], f"pool {view.name}: {why}; not promoted, claimed or deleted")
        view.ignored = set(plan.ignored)
        return plan, pods

    async def _act(self, provider: Any, view: PoolView, template: Any, plan: PoolPlan,
                   pods: Mapping[str, dict[str, Any]]) -> None:
        for name in plan.delete:
            await provider.delete_pool_pod(view.namespace, name, plan.uids[name])
        for name in plan.promote:
            try:
                if await provider.promote_pool_pod(pods[name], view.name):
                    plan.ready += 1
                    plan.starting -= 1
            except ProviderError as exc:  # the image fails the probe: this Pod goes, the status says why
                log.warning("pool %s/%s: Pod %s failed its check: %s", view.namespace, view.name, name, exc)
                await provider.delete_pool_pod(view.namespace, name, plan.uids[name])
                raise
        owner = {"apiVersion": API_VERSION, "kind": "SandboxPool", "name": view.name, "uid": view.uid}
        gate = asyncio.Semaphore(_CONCURRENT_CREATES)

        async def create() -> None:
            async with gate:
                await provider.make_pool_pod(view.namespace, view.name, owner, template)

        if plan.create:
            await asyncio.gather(*(create() for _ in range(plan.create)))
            plan.starting += plan.create

    async def _status(self, view: PoolView, plan: PoolPlan | None, generation: int | None, ready: State, *,
                      thash: str | None = None) -> None:
        changes: dict[str, Any] = {"observedGeneration": generation}
        if plan is not None:
            changes.update(ready=plan.ready, starting=plan.starting, claimed=plan.claimed, total=plan.total,
                           templateHash=thash)
            self.metrics.observe_pool(view.namespace, view.name, ready=plan.ready, starting=plan.starting,
                                      claimed=plan.claimed)
        changes["conditions"] = merge(view.status.get("conditions") or [], {"Ready": ready}, generation, ["Ready"])
        if all(view.status.get(k) == v for k, v in changes.items()):
            return
        with contextlib.suppress(Exception):  # a status that could not be written is written next turn
            await self.objects.patch_status(POOLS, view.namespace, view.name, changes)
            view.status.update(changes)

    # ------------------------------------------------------------------ deletion

    async def cleanup(self, body: Mapping[str, Any]) -> None:
        """The pool is being deleted: its warm Pods go (claimed ones are their sessions'). Any replica may run it
        (deletion only). Starting Pods are left to the cluster, which deletes them with the pool (their
        ownerReferences): their creation seal cannot bind the uid, so a Pod made again under a starting Pod's name
        with the seal copied is not the operator's to delete."""
        meta = body["metadata"]
        provider = self.provider()
        if provider is None:
            return
        pods = await provider.pool_pods(meta["namespace"], meta["name"])
        for pod in pods:
            seen = PoolPod.of(pod, provider.pool_key, meta["name"])
            if seen.sealed and seen.state == WARM and not seen.terminating:
                await provider.delete_pool_pod(meta["namespace"], seen.name, seen.uid)
        self.metrics.forget_pool(meta["namespace"], meta["name"])
