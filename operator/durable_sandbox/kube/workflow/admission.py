"""Admission: policy and plan, before anything is imported, provisioned or executed.

A Workflow is validated and checked against the operator's policy (its provider decided by
``kube/spec/provider_choice.py``: pinned by a run already created, named, or the operator's default; the local provider
only when allowed; entrypoints only from the configured modules, the built-in sandbox-agent always) before its workflow code
is imported; the Secrets its sandbox env names are read (kept in memory for the run, never stored); a
``spec.sandboxRef`` Sandbox is taken for it. Then its run is created in the namespace's store, owned by the
Workflow. A refusal is final (phase Failed, a reason, a Warning Event) until the spec changes; code that is
not importable here, a missing Secret or a busy Sandbox is retried ("not runnable here").
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from durable_sandbox.engine.records import RunRecord
from durable_sandbox.kube.api.client import KubeClient
from durable_sandbox.kube.api.resources import SANDBOXES, WORKFLOWS
from durable_sandbox.kube.reporting.events import LifecycleEvent
from durable_sandbox.kube.reporting.status import Projection
from durable_sandbox.kube.spec.manifests import format_loc
from durable_sandbox.kube.spec.models import SandboxResource, WorkflowResource, without_refused_signals
from durable_sandbox.kube.spec.plan import PlanError, RunPlan, WorkflowUnavailable, plan_workflow
from durable_sandbox.kube.spec.provider_choice import (
    LOCAL,
    ProviderChoice,
    choose_provider,
    pinned_by_run,
    refusal,
    sandbox_choice,
)
from durable_sandbox.kube.spec.secrets import SecretNotReadable, read_secret_values, secret_refs
from durable_sandbox.kube.store import OwnerRef
from durable_sandbox.kube.workflow import forking
from durable_sandbox.kube.workflow.runs import RunView
from durable_sandbox.kube.workflow.settings import OperatorPolicy
from durable_sandbox.kube.workflow.wing import Wing
from durable_sandbox.tracing import annotated_caller
from durable_sandbox.workflows import sandbox_agent

__all__ = ["Admission"]


class Admission:
    def __init__(self, wing: Wing, api: KubeClient, policy: OperatorPolicy) -> None:
        self.api = api  # Secrets are read with it
        self.policy = policy
        self.objects, self.runs, self.engines, self.publisher = wing.objects, wing.runs, wing.engines, wing.publisher
        self.holding = wing.holding

    async def admit(self, view: RunView) -> RunPlan | None:
        """Policy and plan: returns the plan, or None after recording why the run cannot start
        (a rejection is final and written as Failed; a missing Secret or workflow code is retried)."""
        try:
            # A refused signal (too big) is said by steering (an Event, the WaitingForSignal condition) and must not
            # make the whole Workflow invalid: the run goes on without it.
            wf = WorkflowResource.model_validate(without_refused_signals(dict(view.body))[0])
        except ValidationError as exc:
            err = exc.errors()[0]
            ctx = err.get("ctx") or {}
            reason = "UnknownProvider" if err.get("type") == "unknown_provider" else "InvalidSpec"
            loc = format_loc([*err.get("loc", ()), *ctx.get("subloc", [])])
            await self.reject(view, reason, f"{loc}: {err.get('msg')}")
            return None
        # A run created before (by this replica, another one, or an operator started with another default) keeps
        # the provider its stored input pins, whatever this operator's --default-provider says now.
        stored = await self.engines.engine_for(view.namespace).store.get_run(view.run_id)
        plan = await self._plan(view, wf, pinned_by_run(stored.input) if stored is not None else None)
        if plan is None or not await self._ready(view, wf, plan):
            return None
        if not await self._create_run(view, plan, stored):
            return None
        return plan

    async def _plan(self, view: RunView, wf: WorkflowResource, pinned: str | None) -> RunPlan | None:
        named = wf.spec.sandbox.provider if wf.spec.sandbox is not None else None
        sandboxes: dict[str, SandboxResource] = {}
        choice: ProviderChoice | None = None
        if wf.spec.sandbox_ref is not None:
            found = await self._sandbox(view.namespace, wf.spec.sandbox_ref.name)
            if found is not None:
                # The Sandbox's own provider (its record's pin, its spec's, the default): its calls run there.
                of_sandbox = sandbox_choice(await self.holding.records.read(view.namespace, found.metadata.uid or ""),
                                            found.spec.provider, self.policy.default_provider)
                found = found.model_copy(update={"spec": found.spec.model_copy(update={"provider": of_sandbox.name})})
                sandboxes[found.metadata.name] = found
                choice = choose_provider(pinned=pinned, named=of_sandbox.name, default=self.policy.default_provider)
        elif wf.spec.tool_calls is not None:
            choice = choose_provider(pinned=pinned, named=named, default=self.policy.default_provider)
        if choice is not None:
            refused = refusal(choice, where="spec.sandbox.provider", allow_local=self.policy.allow_local_provider)
            if refused is not None:
                await self.reject(view, *refused)
                return None
        try:
            return plan_workflow(
                wf, source=f"{view.namespace}", sandboxes=sandboxes, cluster=True,
                allowed_modules=[*self.policy.workflow_modules, sandbox_agent.__name__],
                default_provider=choice.name if choice is not None else LOCAL,
            )
        except WorkflowUnavailable as exc:
            view.extra.not_runnable = str(exc)
            self.publisher.offer(view)
            return None
        except PlanError as exc:
            await self.reject(view, exc.reason, str(exc))
            return None

    async def _ready(self, view: RunView, wf: WorkflowResource, plan: RunPlan) -> bool:
        """Whatever the run needs from the cluster, taken for it: the Secret values, the Sandbox it attaches to."""
        try:
            self.runs.secrets[view.run_id] = await self._read_secrets(view.namespace, plan)
        except LookupError as exc:
            reason = "SecretNotReadable" if isinstance(exc, SecretNotReadable) else "SecretMissing"
            self.publisher.refused(view, reason, str(exc))
            return False
        if wf.spec.sandbox_ref is not None:
            waits = await self.holding.hold(view.namespace, wf.spec.sandbox_ref.name, view.name)
            if waits is not None:
                view.waiting_for = wf.spec.sandbox_ref.name
                view.extra.not_runnable, view.extra.not_runnable_reason = waits, "WaitingForSandbox"
                self.publisher.offer(view)
                return False
        view.waiting_for = None
        view.extra.not_runnable, view.extra.not_runnable_reason = None, None
        self.runs.env_values[view.run_id] = dict(plan.env_values)
        return True

    async def _create_run(self, view: RunView, plan: RunPlan, stored: RunRecord | None) -> bool:
        """The run, created unless ``stored`` (read at the start of this admission) has it already (a fork: made
        from its source, kube/workflow/forking.py). False: refused (said)."""
        engine = self.engines.engine_for(view.namespace)
        store: Any = engine.store  # a KubernetesStore: the run's objects are owned by the Workflow
        run = stored
        if plan.fork_of is not None and (run is None or forking.half_made(run)):
            run = await self._fork(view, plan, run)
            if run is None:
                return False
            self.publisher.admitted(view, f"{_admitted(plan)}, a fork of Workflow {plan.fork_of.workflow} after "
                                    f"call {plan.fork_of.after_call}")
        elif run is None:
            # A traceparent annotation parents the run's spans (docs/operations.md, "Traces").
            labels = {**plan.labels, **annotated_caller((view.body.get("metadata") or {}).get("annotations"))}
            record = engine.client.record(plan.definition, plan.input, run_id=plan.run_id, labels=labels)
            run, created = await store.create_run(record, owner=OwnerRef(name=view.name, uid=view.uid))
            if created:
                self.publisher.admitted(view, _admitted(plan))
        view.run = run
        view.projection = Projection(total_calls=_total_calls(plan))
        view.projection.feed(await store.load_journal(view.run_id))
        return True

    async def _fork(self, view: RunView, plan: RunPlan, stored: RunRecord | None) -> RunRecord | None:
        """The run of a ``spec.forkOf`` Workflow, made from its source (None: refused, said)."""
        assert plan.fork_of is not None
        engine = self.engines.engine_for(view.namespace)
        source = await self.objects.get(WORKFLOWS, view.namespace, plan.fork_of.workflow)  # its own namespace only
        try:
            return await forking.make_fork(engine, plan, namespace=view.namespace, run_id=view.run_id,
                                           owner=OwnerRef(name=view.name, uid=view.uid), source=source,
                                           secrets=self.runs.secrets.get(view.run_id), stored=stored)
        except forking.ForkOfRefused as exc:
            await self.reject(view, exc.reason, str(exc))
            return None
        except forking.ForkOfBusy as exc:  # another replica is making it: looked at again (not runnable here)
            view.extra.not_runnable = str(exc)
            self.publisher.offer(view)
            return None

    async def reject(self, view: RunView, reason: str, message: str) -> None:
        view.extra.rejected = (reason, message)
        self.publisher.emit(view.body, LifecycleEvent(reason, message[:1024], "Warning"))
        assert view.writer is not None
        view.writer.offer(self.publisher.status_of(view))
        await view.writer.flush()

    async def _sandbox(self, namespace: str, name: str) -> SandboxResource | None:
        obj = await self.objects.get(SANDBOXES, namespace, name)
        return SandboxResource.model_validate(obj) if obj is not None else None

    async def _read_secrets(self, namespace: str, plan: RunPlan) -> dict[tuple[str, str], str]:
        """The Secret values the run's sandbox env references (values never leave this process's memory
        except into the sandbox)."""
        sandbox = plan.input.get("sandbox") if isinstance(plan.input, dict) else None
        refs = secret_refs((sandbox or {}).get("env") or [])
        return await read_secret_values(self.api.core, namespace, refs, where="spec.sandbox.env")


def _admitted(plan: RunPlan) -> str:
    """What the lifecycle log says of a run just created: what it runs and where."""
    calls = _total_calls(plan)
    what = f"{calls} tool call(s)" if calls is not None else f"entrypoint {plan.definition.name}"
    return f"run created ({what}" + (f", provider {plan.provider})" if plan.provider else ")")


def _total_calls(plan: RunPlan) -> int | None:
    if isinstance(plan.input, dict) and isinstance(plan.input.get("toolCalls"), list):
        return len(plan.input["toolCalls"]) + (plan.fork_of.after_call if plan.fork_of is not None else 0)
    return None
