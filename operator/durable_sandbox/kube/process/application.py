"""The operator process as one object (as kopf passes its ``memo`` and Temporal builds a ``Worker``).

``dsb operator`` builds an :class:`OperatorConfig` once and an :class:`OperatorApplication` on it, and hands the
application to kopf (``kube/handlers.py``, which keeps kopf's registrations only and reads the application from
kopf's memo). The application owns everything the process runs:

- the API client, and the API server's away-reporter (said once, probed while it is away);
- the Workflow controller (:class:`~durable_sandbox.kube.workflow.controller.Operator`), the Sandbox, SandboxPool
  and WorkflowSchedule controllers, the orphan sweep;
- the metrics, and the server of ``/metrics``, ``/healthz`` and ``/readyz`` (with this replica's readiness);
- the stop path: SIGTERM or SIGINT hands the runs executing here over to other replicas, then stops kopf
  (``stop_flag``); kopf's cleanup handler then closes everything, in the order :meth:`close` says.

Nothing of it is a module global: a test starts an application on fakes, without kopf, and two in one process
share nothing.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from durable_sandbox.kube.api.apiserver_away import ApiServerAway
from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.api.discovery import Wanted, list_one, wait_until_served
from durable_sandbox.kube.api.resources import WORKFLOWS, CustomObjects
from durable_sandbox.kube.pool import PoolController, PoolSettings
from durable_sandbox.kube.process.process_config import OperatorConfig, Service
from durable_sandbox.kube.process.sweep_task import SweepTask
from durable_sandbox.kube.sandbox import SandboxController, SandboxControllerSettings
from durable_sandbox.kube.schedule import ScheduleController, ScheduleSettings
from durable_sandbox.kube.store.journals import open_journal
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics, process_metrics
from durable_sandbox.kube.telemetry.metrics_server import MetricsServer, Readiness, start_metrics_server
from durable_sandbox.kube.workflow.controller import Operator
from durable_sandbox.providers.kubernetes_egress import ENV_EGRESS_POLICY, egress_notice

__all__ = ["NotServing", "OperatorApplication", "Serving"]

log = logging.getLogger("durable_sandbox.kube.handlers")


class NotServing(RuntimeError):
    def __init__(self) -> None:
        super().__init__("the operator is not serving (it has not started, or it has stopped)")


@dataclass(frozen=True)
class Serving:
    """What the application runs between its start and its close."""

    api: KubeClient
    workflows: Operator
    sandboxes: SandboxController
    pools: PoolController
    schedules: ScheduleController


class OperatorApplication:
    def __init__(self, config: OperatorConfig, *, metrics: OperatorMetrics | None = None,
                 away: ApiServerAway | None = None) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else process_metrics()
        self.away = away if away is not None else ApiServerAway()  # the API client made by start() reports here
        self.readiness = Readiness()
        self.stop_flag = asyncio.Event()  # kopf stops once it is set (bound to kopf's loop on first use)
        self.unserved: str | None = None  # why the operator stopped on its own, once it has
        self.background: set[asyncio.Task[Any]] = set()  # short tasks of its own (kube/handlers.py's touches)
        self._serving: Serving | None = None
        self._sweep: SweepTask | None = None
        self._server: MetricsServer | None = None
        self._stopping: asyncio.Task[None] | None = None
        self._services: list[Service] = []  # config.services started, stopped in reverse at close

    # ------------------------------------------------------------------ what it runs

    @property
    def serving(self) -> Serving:
        if self._serving is None:
            raise NotServing()
        return self._serving

    @property
    def metrics_server(self) -> MetricsServer | None:
        """The server of /metrics, /healthz and /readyz while it serves (its bound port: ``.port``)."""
        return self._server

    @property
    def stopped(self) -> bool:
        """Not serving (not started yet, or closed)."""
        return self._serving is None

    @property
    def workflows(self) -> Operator:
        return self.serving.workflows

    @property
    def sandboxes(self) -> SandboxController:
        return self.serving.sandboxes

    @property
    def pools(self) -> PoolController:
        return self.serving.pools

    @property
    def schedules(self) -> ScheduleController:
        return self.serving.schedules

    # ------------------------------------------------------------------ start

    async def start(self, api: KubeClient | None = None, *, objects: CustomObjects | None = None) -> None:
        """Build the controllers and serve: the metrics endpoint first (it answers, not ready, while the API server's
        discovery is waited for), then once discovery lists every served resource, the sweep, and ready. ``api``
        and ``objects``: a client (and custom objects) made by the caller, a test's fakes; else connected here."""
        if api is None:
            api = await KubeClient.connect(kubeconfig=self.config.kubeconfig, metrics=self.metrics, away=self.away)
        self._serving = await self._build(api, objects)
        if self.config.metrics_port is not None:
            self._server = await start_metrics_server(self.metrics, port=self.config.metrics_port,
                                                      host=self.config.metrics_host, readiness=self.readiness)
        # kopf reads discovery once, right after this returns (its scanning is off): only once it is complete, and
        # once the resources' storage answers a LIST (else kopf's first watches meet a 429 "storage is
        # (re)initializing", as does the orphan sweep's first round).
        namespaces = self.config.namespaces
        wanted = Wanted(namespace=namespaces[0] if namespaces else None)
        await wait_until_served(api, wanted)
        api.away.configure(lambda: list_one(api, wanted, WORKFLOWS))
        self._sweep = SweepTask.start(api, self._serving.workflows, namespaces, self.metrics)
        for service in self.config.services:
            await service.start(self._serving.workflows)
            self._services.append(service)
        self.readiness.ready()
        config, policy = self.config, self.config.policy
        log.info("operator %s serving Workflows (default provider %s; local provider %s; workflow modules: %s; journal "
                 "in %s)", config.settings.worker_id, policy.default_provider,
                 "allowed" if policy.allow_local_provider else "refused",
                 ", ".join(policy.workflow_modules) or "none", config.journal)
        if "kubernetes" in self._serving.workflows.engines.usable_provider_names():
            log.log(*egress_notice({ENV_EGRESS_POLICY: config.egress_policy}))

    async def _build(self, api: KubeClient, objects: CustomObjects | None) -> Serving:
        config, settings, policy = self.config, self.config.settings, self.config.policy
        journals = await open_journal(config.journal, api, journal_key=config.journal_key)
        make = config.providers
        op = Operator(api, policy=policy, settings=settings, objects=objects,
                      providers=(lambda name: make(name, self.metrics)) if make is not None else None,
                      journal_key=config.journal_key, journals=journals, metrics=self.metrics)
        sandboxes = SandboxController(api, op.events, op.provider_for, SandboxControllerSettings(
            worker_id=settings.worker_id, lease_ttl=settings.lease_ttl, default_provider=policy.default_provider,
            allow_local_provider=policy.allow_local_provider), labels=op.sandbox_labels, records=op.records,
            holding=op.holding, journals=journals)
        pool_provider = config.pool_provider
        pools = PoolController(api, (lambda: pool_provider(self.metrics)) if pool_provider is not None else None,
                               self.metrics, PoolSettings(worker_id=settings.worker_id, lease_ttl=settings.lease_ttl))
        schedules = ScheduleController(
            api, op.events, op.engines.current_run,  # a Workflow's run, or the last of its continue-as-new chain
            config.journal_key, ScheduleSettings(worker_id=settings.worker_id, lease_ttl=settings.lease_ttl))
        return Serving(api, op, sandboxes, pools, schedules)

    # ------------------------------------------------------------------ what the watches see

    def workflow_event(self, body: Mapping[str, Any], *, deleted: bool) -> None:
        uid = body.get("metadata", {}).get("uid", "")
        if deleted:
            self.metrics.forget_workflow(uid)
        else:
            self.metrics.observe_workflow(uid, body.get("status"))
        if self._serving is None:
            return  # stopping: the watch outlives the controllers by a moment
        if deleted:
            self._serving.workflows.forget(body)
        else:
            self._serving.workflows.notice(body)

    def sandbox_event(self, body: Mapping[str, Any]) -> None:
        if self._serving is None:
            return
        self._serving.sandboxes.notice(body)
        meta = body.get("metadata", {})  # Workflows waiting for this Sandbox (spec.sandboxRef) look again
        self._serving.workflows.sandbox_changed(meta.get("namespace", ""), meta.get("name", ""))

    def pool_event(self, body: Mapping[str, Any]) -> None:
        if self._serving is not None:
            self._serving.pools.notice(body)

    def schedule_event(self, body: Mapping[str, Any]) -> None:
        if self._serving is not None:
            self._serving.schedules.notice(body)

    # ------------------------------------------------------------------ the stop path

    def take_signals(self) -> None:
        """SIGTERM and SIGINT are this application's from now on (kopf's own handlers would stop within seconds,
        cancelling the runs executing here: runs are tasks of the operator, not kopf daemons)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.begin_stop, sig.name)

    def begin_stop(self, why: str) -> None:
        """SIGTERM (a rolling update) or SIGINT: hand every run executing here over at a call boundary, then stop
        kopf; not ready meanwhile. A second signal stops at once."""
        if self._stopping is not None:
            self.stop_flag.set()
            return
        log.info("%s: handing this replica's runs over, then stopping", why)
        self.readiness.not_ready("stopping: handing runs over to other replicas")
        self._stopping = asyncio.get_running_loop().create_task(self._hand_over_then_stop())

    def stop_unserved(self, why: str) -> None:
        """kopf does not serve this operator's resources (kube/handlers.py's guard): stop, saying why."""
        if self.unserved is not None:
            return
        self.unserved = why
        log.error("%s; stopping", why)
        self.begin_stop("kopf serves nothing")

    async def _hand_over_then_stop(self) -> None:
        try:
            if self._serving is not None:
                await self._serving.workflows.shutdown()
        finally:
            self.stop_flag.set()

    async def close(self) -> None:
        """Close everything, last thing of the process: the away-probe and the sweep, the Sandbox and pool
        controllers, the runs (handed over, if a signal did not already), the journals, the API client; the
        metrics server last, so that it answers while the runs are handed over."""
        try:
            while self._services:  # first: a service uses the controllers closed below
                await self._services.pop().stop()
            await self.away.aclose()
            sweep, self._sweep = self._sweep, None
            if sweep is not None:
                await sweep.stop()
            serving, self._serving = self._serving, None
            if serving is None:
                return
            if serving.api.away is not self.away:
                await serving.api.away.aclose()
            await serving.sandboxes.aclose()
            await serving.pools.aclose()
            await serving.workflows.shutdown()
            await serving.workflows.aclose()
            await serving.api.close()
        finally:
            server, self._server = self._server, None
            if server is not None:
                try:
                    await server.stop()
                except Exception as exc:  # the process is exiting: say so, and close the rest
                    log.warning("stopping the metrics server failed: %s: %s", type(exc).__name__, exc)
