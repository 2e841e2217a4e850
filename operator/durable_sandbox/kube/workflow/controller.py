"""The operator's Workflow controller, without kopf: the wiring of the rooms in ``kube/workflow/``.

kopf (``kube/handlers.py``) calls four things here: :meth:`Operator.notice` for every watch event of a
Workflow (the initial listing included), :meth:`Operator.forget` when one is gone,
:meth:`Operator.sandbox_changed` when a Sandbox changes, and :meth:`Operator.cleanup` from the delete handler
(behind the ``durable-sandbox.dev/cleanup`` finalizer); :meth:`Operator.shutdown` on SIGTERM.

**Active and parked runs.** A run is *active* while a task of this process drives it (admits it, claims its
Lease, executes it, writes its status). When the run has nothing to do for a while (it waits on a signal,
a durable timer, ``spec.suspend``, a retry backoff, a Sandbox, another replica's Lease, or it is finished)
the task ends and the run is *parked*: a small record (names, generation, why) and at most one timer
handle, no task, no journal, no status writer, no sandbox (a waiting run's sandbox is hibernated). A
parked run becomes active again on the watch event that can change its course (a new ``generation``:
``signals``, ``suspend``, ``cancel``; for a run another replica executes, also its status ``phase``, which
that replica writes when it hands the run over or finishes it) or when its timer fires (``wakeAt``, the
hibernation point, the TTL after finishing, the end of another replica's Lease), never by a per-run poll.
That is what keeps a thousand Workflows waiting on approvals at a few KiB each (docs/benchmarks.md).

**Replicas share the work.** kopf runs in standalone peering on every replica, so every replica sees every
Workflow; the run's Lease decides who executes it. Claims are spread by delay: a replica waits before
claiming in proportion to the runs it executes already (with jitter), so the less busy replica wins the
race for new runs and a batch splits between replicas without any membership protocol (docs/operations.md
says why this and not sharding by run id). A replica that loses the claim parks the run until the Lease
could have expired (or the holder's status says it handed the run over or finished it); a dead holder's
runs are taken over after about one lease period and replayed, fenced by the Lease's transitions. Only the
replica executing a run writes its status (a projection of the commits it makes, see ``kube/reporting/status.py``)
and its lifecycle Events.

Operator policy, checked before anything is imported or provisioned: the local provider only with
``allow_local_provider``; entrypoints only from the configured workflow modules (``sandbox-agent``
always); provider credentials from Secrets named by ``sandbox.env[].valueFrom.secretKeyRef``, read
per run in the Workflow's namespace, handed to the sandbox and never journaled or logged.

Which room does what: ``kube/workflow/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.api.resources import CustomObjects
from durable_sandbox.kube.holders.holding import Holding
from durable_sandbox.kube.journal.sandbox_records import SandboxRecords
from durable_sandbox.kube.reporting.events import EventRecorder
from durable_sandbox.kube.store.journals import ApiServerJournal, JournalStores
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.kube.workflow.admission import Admission
from durable_sandbox.kube.workflow.cleanup import Cleanup
from durable_sandbox.kube.workflow.concurrency import RunSlots
from durable_sandbox.kube.workflow.engines import Engines
from durable_sandbox.kube.workflow.execution import Execution
from durable_sandbox.kube.workflow.finished import Finisher
from durable_sandbox.kube.workflow.publishing import Publisher
from durable_sandbox.kube.workflow.queued_runs import QueuedRuns
from durable_sandbox.kube.workflow.runs import Runs, RunView
from durable_sandbox.kube.workflow.scheduler import Scheduler
from durable_sandbox.kube.workflow.settings import OperatorPolicy, OperatorSettings
from durable_sandbox.kube.workflow.shutdown import shutdown
from durable_sandbox.kube.workflow.turn import Turn
from durable_sandbox.kube.workflow.wing import Wing
from durable_sandbox.sandbox_engine import Engine

__all__ = ["Operator", "OperatorPolicy", "OperatorSettings"]


class Operator:
    """The Workflow controller of one replica: its rooms, built once and wired together."""

    def __init__(
        self,
        api: KubeClient,
        *,
        policy: OperatorPolicy | None = None,
        settings: OperatorSettings | None = None,
        providers: Any = None,
        objects: CustomObjects | None = None,
        journal_key: bytes | None = None,
        journals: JournalStores | None = None,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.api = api
        # The process's metrics (kube/process/application.py); a test's controller counts into its own.
        self.metrics = metrics if metrics is not None else OperatorMetrics(process_collectors=False)
        self.objects = objects if objects is not None else CustomObjects(api)
        self.policy = policy or OperatorPolicy()
        self.settings = settings or OperatorSettings()
        self.events = EventRecorder(api.core, instance=self.settings.worker_id, away=api.away)
        self.runs = Runs()
        self.slots = RunSlots(self.settings.max_concurrent_runs)
        self.publisher = Publisher(self.objects, self.events, self.runs, self.settings)
        # journal_key seals every journal value this operator writes (kube/journal/sealing.py)
        if journals is None:
            journals = JournalStores(ApiServerJournal(), api, journal_key=journal_key)
        self.engines = Engines(api, self.objects, self.policy, self.settings, self.runs, self.publisher, journals,
                               providers)
        self.records = SandboxRecords(api, journal_key)  # the Sandbox resources' own records (kube/journal/sandbox_records.py)
        self.holding = Holding(self.objects, self.records, self.engines.run_live)
        self.engines.holding = self.holding
        wing = Wing(self.objects, self.runs, self.settings, self.publisher, self.engines, self.holding, self.metrics,
                    api.away)
        self.admission = Admission(wing, api, self.policy)
        self.execution = Execution(wing, self.slots)
        self.finisher = Finisher(wing)
        self.turn = Turn(wing, self.admission, self.execution, self.finisher, QueuedRuns(wing, api, journal_key))
        self.scheduler = Scheduler(wing, self.turn.serve)
        self.engines.runnable = self.scheduler.runnable
        self.finalizer = Cleanup(wing)
        self.metrics.runs.labels(state="active").set_function(lambda: len(self.runs.active))
        self.metrics.runs.labels(state="parked").set_function(lambda: len(self.runs.parked))

    # ------------------------------------------------------------------ what kopf calls

    def notice(self, body: Mapping[str, Any]) -> None:
        self.scheduler.notice(body)

    def forget(self, body: Mapping[str, Any]) -> None:
        self.scheduler.forget(body)

    def sandbox_changed(self, namespace: str, name: str) -> None:
        self.scheduler.sandbox_changed(namespace, name)

    async def cleanup(self, body: Mapping[str, Any], attempt: int = 0) -> None:
        await self.finalizer.cleanup(body, attempt)

    async def shutdown(self) -> None:
        await shutdown(self.runs, self.scheduler, self.settings)

    async def aclose(self) -> None:
        await self.publisher.aclose()
        await self.engines.aclose()

    # ------------------------------------------------------------------ what the rest of the operator reads

    @property
    def stopping(self) -> bool:
        return self.runs.stopping

    @property
    def sandbox_labels(self) -> dict[str, str]:
        return self.engines.sandbox_labels

    def provider_for(self, name: str) -> Any:
        return self.engines.provider(name)

    def engine_for(self, namespace: str) -> Engine:
        return self.engines.engine_for(namespace)

    def status_of(self, view: RunView) -> dict[str, Any]:
        return self.publisher.status_of(view)
