"""The operator's Prometheus metrics (prometheus-client; served by :mod:`durable_sandbox.kube.telemetry.metrics_server`).

Every metric is listed with its labels in docs/operations.md. Where the numbers come from:

* tool calls, their latency, snapshots, sandbox losses, recoveries and cleanup failures: an
  :class:`InstrumentedProvider` wrapped around each provider the operator uses (:meth:`OperatorMetrics.instrument`),
  so they count what this process really asked of the provider, by provider name;
* Workflows by phase and Workflows whose cleanup is blocked: :meth:`OperatorMetrics.observe_workflow`, fed
  from the watch, which every replica sees in full (so these gauges are the same on every replica);
* Kubernetes API requests by verb, resource and HTTP status: :meth:`OperatorMetrics.instrument_api_client`;
* lease takeovers and reconcile errors: counted where they happen (``lease_takeovers.inc()``,
  ``reconcile_errors.labels(kind=...).inc()``).

Metrics live in a registry of their own (plus the process and platform collectors), so a test or a second
operator in one process starts from zero.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from durable_sandbox.providers.contract import (
    ProviderCapabilities,
    SandboxGone,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    SnapshotEntry,
    ToolCall,
    ToolResult,
)
from durable_sandbox.providers.kubernetes_pool import PoolClaim

PREFIX = "durable_sandbox"
# The phases status.phase takes; always exported (as 0) so dashboards and alerts see every series.
PHASES = ("Pending", "Running", "Waiting", "Suspended", "Succeeded", "Failed", "Cancelled")
# Tool calls take from milliseconds (local) to many minutes (a build in a cloud sandbox).
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

T = TypeVar("T")


class WorkflowIndex(Collector):
    """Workflows by phase (and with CleanupBlocked), from what the watch last said about each object."""

    def __init__(self) -> None:
        self._phase: dict[str, str] = {}
        self._blocked: set[str] = set()

    def observe(self, uid: str, phase: str | None, *, cleanup_blocked: bool = False) -> None:
        self._phase[uid] = phase or "Pending"
        if cleanup_blocked:
            self._blocked.add(uid)
        else:
            self._blocked.discard(uid)

    def forget(self, uid: str) -> None:
        self._phase.pop(uid, None)
        self._blocked.discard(uid)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        by_phase = GaugeMetricFamily(
            f"{PREFIX}_workflows", "Workflows by status.phase, as this replica's watch sees them.", labels=["phase"]
        )
        tally = Tally(self._phase.values())
        for phase in (*PHASES, *sorted(set(tally) - set(PHASES))):
            by_phase.add_metric([phase], tally.get(phase, 0))
        yield by_phase
        yield GaugeMetricFamily(
            f"{PREFIX}_workflows_cleanup_blocked",
            "Workflows whose CleanupBlocked condition is True (the provider refuses to delete a sandbox or snapshot).",
            value=len(self._blocked),
        )


class OperatorMetrics:
    """The operator's metrics in one registry. ``generate()`` is the text exposition for ``/metrics``."""

    def __init__(self, *, process_collectors: bool = True) -> None:
        self.registry = CollectorRegistry()
        if process_collectors:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
        r = self.registry
        self.workflows = WorkflowIndex()
        r.register(self.workflows)
        self.tool_calls = Counter(
            f"{PREFIX}_tool_calls", "Tool calls executed by a sandbox provider (recovery replays included).",
            ["provider", "outcome"], registry=r,
        )
        self.tool_call_seconds = Histogram(
            f"{PREFIX}_tool_call_duration_seconds", "Time a provider took to execute a tool call.",
            ["provider"], buckets=CALL_BUCKETS, registry=r,
        )
        self.snapshots = Counter(
            f"{PREFIX}_snapshots", "Snapshots taken.", ["provider"], registry=r,
        )
        self.sandbox_losses = Counter(
            f"{PREFIX}_sandbox_losses", "Sandboxes found gone (or destroyed by loss injection) mid-run.",
            ["provider"], registry=r,
        )
        self.recoveries = Counter(
            f"{PREFIX}_recoveries", "Replacement sandboxes made after a loss (restore of the newest snapshot, or fresh).",
            ["provider"], registry=r,
        )
        self.cleanup_failures = Counter(
            f"{PREFIX}_cleanup_failures", "Sandbox or snapshot deletions the provider refused (retried with backoff).",
            ["provider", "operation"], registry=r,
        )
        self.orphans_destroyed = Counter(
            f"{PREFIX}_orphan_sandboxes_destroyed", "Sandboxes with this installation's tag that no live Workflow or "
            "Sandbox resource claimed, destroyed by the orphan sweep (kube/sweep/orphans.py).", ["provider"], registry=r,
        )
        self.orphan_snapshots_destroyed = Counter(
            f"{PREFIX}_orphan_snapshots_destroyed", "Snapshots with this installation's tag that no live Workflow or "
            "Sandbox resource claimed, deleted by the orphan sweep (kube/sweep/orphans.py).", ["provider"], registry=r,
        )
        self.orphan_sweeps = Counter(
            f"{PREFIX}_orphan_sweeps", "Orphan sweeps run, by outcome (ok, or error: the sweep was skipped).",
            ["outcome"], registry=r,
        )
        self.lease_takeovers = Counter(
            f"{PREFIX}_lease_takeovers", "Runs taken over from another worker whose Lease had expired.", registry=r,
        )
        self.kube_requests = Counter(
            f"{PREFIX}_kube_api_requests", "Requests to the Kubernetes API by verb, resource and HTTP status code.",
            ["verb", "resource", "code"], registry=r,
        )
        self.reconcile_errors = Counter(
            f"{PREFIX}_reconcile_errors", "Handler invocations that raised (kopf retries them).", ["kind"], registry=r,
        )
        self.info = Gauge(f"{PREFIX}_build_info", "The running operator's version.", ["version"], registry=r)
        # What an idle Workflow costs shows here: a per-Workflow task (or a leak of them) makes this grow with
        # the number of Workflows served; parked runs (waiting on a signal or a timer) have none.
        self.event_loop_tasks = Gauge(
            f"{PREFIX}_event_loop_tasks", "asyncio tasks alive in the operator's event loop.", registry=r,
        )
        self.event_loop_tasks.set_function(_loop_tasks)
        self.runs = Gauge(
            f"{PREFIX}_runs", "Runs this replica tracks, by state: active (a task is driving it here) or parked "
            "(waiting for a watch event or its timer; no task, no journal in memory).", ["state"], registry=r,
        )

        self._pool_metrics(r)

    def _pool_metrics(self, r: CollectorRegistry) -> None:
        # Warm pools (kube/pool/, providers/kubernetes_pool.py). Pods by state come from the replica that
        # reconciles the pool (the others export nothing for it); claims and misses from whichever replica provisioned.
        self.pool_pods = Gauge(
            f"{PREFIX}_pool_pods", "Pods of a SandboxPool by state: ready (warm, unclaimed), starting, claimed.",
            ["namespace", "pool", "state"], registry=r,
        )
        self.pool_claims = Counter(
            f"{PREFIX}_pool_claims", "Provisions that claimed a warm Pod of the pool.", ["namespace", "pool"], registry=r,
        )
        self.pool_misses = Counter(
            f"{PREFIX}_pool_misses", "Provisions of a PodTemplate that made a Pod instead of claiming one, by reason: "
            "none-ready, contended (every ready Pod was claimed by others meanwhile), env (a sandbox with env needs a "
            "Pod of its own).", ["namespace", "template", "reason"], registry=r,
        )
        self.pool_claim_seconds = Histogram(
            f"{PREFIX}_pool_claim_duration_seconds", "Time a provision spent looking for and claiming a warm Pod.",
            ["outcome"], buckets=CALL_BUCKETS, registry=r,
        )

    def generate(self) -> bytes:
        return generate_latest(self.registry)

    def observe_pool_claim(self, claim: PoolClaim) -> None:
        """What one provision did with a pool (the kubernetes provider's ``pool_observer``)."""
        if claim.outcome == "claimed":
            self.pool_claims.labels(namespace=claim.namespace, pool=claim.pool).inc()
        else:
            self.pool_misses.labels(namespace=claim.namespace, template=claim.pool, reason=claim.reason).inc()
        self.pool_claim_seconds.labels(outcome=claim.outcome).observe(claim.seconds)

    def observe_pool(self, namespace: str, pool: str, *, ready: int, starting: int, claimed: int) -> None:
        for state, value in (("ready", ready), ("starting", starting), ("claimed", claimed)):
            self.pool_pods.labels(namespace=namespace, pool=pool, state=state).set(value)

    def forget_pool(self, namespace: str, pool: str) -> None:
        for state in ("ready", "starting", "claimed"):
            try:
                self.pool_pods.remove(namespace, pool, state)
            except KeyError:
                pass

    # -- feeds ---------------------------------------------------------------------------------------

    def observe_workflow(self, uid: str, status: dict[str, Any] | None) -> None:
        """Record what the watch says about a Workflow (its ``status`` stanza)."""
        status = status or {}
        blocked = any(
            c.get("type") == "CleanupBlocked" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        self.workflows.observe(uid, status.get("phase"), cleanup_blocked=blocked)

    def forget_workflow(self, uid: str) -> None:
        self.workflows.forget(uid)

    def instrument(self, provider: SandboxProvider) -> SandboxProvider:
        """``provider`` with its calls counted and timed (see :class:`InstrumentedProvider`)."""
        if isinstance(provider, InstrumentedProvider):
            return provider
        cls = type(f"Instrumented{type(provider).__name__}", (InstrumentedProvider,), {"name": provider.name})
        instrumented: InstrumentedProvider = cls(provider, self)
        return instrumented

    def instrument_api_client(self, api_client: Any) -> Any:
        """Count every request a ``kubernetes.aio`` (or ``kubernetes``) ``ApiClient`` makes, by verb and result.

        Wraps the client's ``rest_client.request`` (the one place every typed API call goes through) in place.
        """
        rest = api_client.rest_client
        if getattr(rest.request, "_dsb_metered", False):
            return api_client
        original = rest.request

        def record(method: str, url: str, query: Any, code: str) -> None:
            verb, resource = api_verb(method, url, query)
            self.kube_requests.labels(verb=verb, resource=resource, code=code).inc()

        if _is_coroutine_function(original):

            async def request_async(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
                try:
                    response = await original(method, url, *args, **kwargs)
                except Exception as exc:
                    record(method, url, kwargs.get("query_params"), _status_of(exc))
                    raise
                record(method, url, kwargs.get("query_params"), str(getattr(response, "status", "")))
                return response

            wrapper: Any = request_async
        else:

            def request_sync(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
                try:
                    response = original(method, url, *args, **kwargs)
                except Exception as exc:
                    record(method, url, kwargs.get("query_params"), _status_of(exc))
                    raise
                record(method, url, kwargs.get("query_params"), str(getattr(response, "status", "")))
                return response

            wrapper = request_sync
        wrapper._dsb_metered = True
        rest.request = wrapper
        return api_client


def _loop_tasks() -> float:
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # scraped outside the event loop (a test calling generate() directly)
        return 0.0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("durable-sandbox")
    except PackageNotFoundError:
        return "unknown"


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def _status_of(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    return str(status) if isinstance(status, int) and status else "error"


_PATH = re.compile(
    r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?(?:/(?P<resource>[^/]+))?(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?/?$"
)


def api_verb(method: str, url: str, query: Any = None) -> tuple[str, str]:
    """The Kubernetes verb (get, list, watch, create, update, patch, delete, deletecollection) and the
    resource (``workflows``, ``workflows/status``, ``leases``...) of a request, as the API server's audit
    and ``apiserver_request_total`` name them."""
    path = url.split("://", 1)[-1]
    path = "/" + path.split("/", 1)[1] if "/" in path else "/"
    path, _, query_string = path.partition("?")
    params = dict(query) if isinstance(query, list | tuple | dict) else {}
    watch = params.get("watch") in (True, "true", "1", 1) or "watch=true" in query_string or "watch=1" in query_string
    m = _PATH.match(path)
    resource, named = "", False
    if m:
        resource = m.group("resource") or ""
        named = m.group("name") is not None
        if m.group("ns") is not None and m.group("resource") is None:
            resource, named = "namespaces", True
        if m.group("sub"):
            resource = f"{resource}/{m.group('sub')}"
    method = method.upper()
    if method == "GET":
        verb = "watch" if watch else ("get" if named else "list")
    elif method == "POST":
        verb = "create"
    elif method == "PUT":
        verb = "update"
    elif method == "PATCH":
        verb = "patch"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = method.lower()
    return verb, resource or "other"


class InstrumentedProvider(SandboxProvider):
    """Delegates every contract method to the wrapped provider and counts what happened.

    A recovery is counted when a sandbox is provisioned or restored after this process saw a loss (the
    provider said the sandbox is gone, or loss injection destroyed it), so hibernation's restores are not.
    A process that crashes between the loss and the replacement does not count that recovery.
    """

    def __init__(self, inner: SandboxProvider, metrics: OperatorMetrics) -> None:
        self.inner = inner
        self._m = metrics
        self._losses = 0

    def __getattr__(self, attr: str) -> Any:
        # Anything beyond the contract (a provider's own settings) is the wrapped provider's.
        return getattr(self.inner, attr)

    def capabilities(self) -> ProviderCapabilities:
        return self.inner.capabilities()

    def _lost(self) -> None:
        self._losses += 1
        self._m.sandbox_losses.labels(provider=self.name).inc()

    def _replaced(self) -> None:
        if self._losses:
            self._losses -= 1
            self._m.recoveries.labels(provider=self.name).inc()

    async def _watch(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except SandboxGone:
            self._lost()
            raise

    async def provision(self, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        handle = await self.inner.provision(spec, lease_seconds=lease_seconds)
        self._replaced()
        return handle

    async def execute(self, handle: SandboxHandle, call: ToolCall) -> ToolResult:
        start = time.perf_counter()
        try:
            result = await self.inner.execute(handle, call)
        except SandboxGone:
            self._lost()
            self._m.tool_calls.labels(provider=self.name, outcome="sandbox_gone").inc()
            raise
        except Exception:
            self._m.tool_calls.labels(provider=self.name, outcome="error").inc()
            raise
        finally:
            self._m.tool_call_seconds.labels(provider=self.name).observe(time.perf_counter() - start)
        self._m.tool_calls.labels(provider=self.name, outcome="ok" if result.exit_code == 0 else "nonzero_exit").inc()
        return result

    async def snapshot(self, handle: SandboxHandle, *, operation_id: str) -> str:
        snapshot_id = await self._watch(lambda: self.inner.snapshot(handle, operation_id=operation_id))
        self._m.snapshots.labels(provider=self.name).inc()
        return snapshot_id

    async def restore(self, snapshot_id: str, spec: SandboxSpec, *, lease_seconds: int) -> SandboxHandle:
        handle = await self.inner.restore(snapshot_id, spec, lease_seconds=lease_seconds)
        self._replaced()
        return handle

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._cleanup("delete_snapshot", lambda: self.inner.delete_snapshot(snapshot_id))

    async def copy_snapshot(self, snapshot_id: str, *, operation_id: str) -> str:
        return await self.inner.copy_snapshot(snapshot_id, operation_id=operation_id)

    async def suspend(self, handle: SandboxHandle) -> None:
        await self._watch(lambda: self.inner.suspend(handle))

    async def resume(self, handle: SandboxHandle) -> SandboxHandle:
        return await self._watch(lambda: self.inner.resume(handle))

    async def renew_lease(self, handle: SandboxHandle, seconds: int) -> SandboxHandle:
        return await self._watch(lambda: self.inner.renew_lease(handle, seconds))

    async def reset_processes(self, handle: SandboxHandle) -> None:
        await self._watch(lambda: self.inner.reset_processes(handle))

    async def destroy(self, handle: SandboxHandle) -> None:
        await self._cleanup("destroy", lambda: self.inner.destroy(handle))

    async def _cleanup(self, operation: str, call: Callable[[], Awaitable[None]]) -> None:
        try:
            await call()
        except Exception:
            self._m.cleanup_failures.labels(provider=self.name, operation=operation).inc()
            raise

    async def list_sandboxes(self, owner: str) -> list[SandboxHandle]:
        return await self.inner.list_sandboxes(owner)

    async def inventory_sandboxes(self, installation: str) -> list[SandboxHandle]:
        return await self.inner.inventory_sandboxes(installation)

    async def inventory_snapshots(self, installation: str) -> list[SnapshotEntry]:
        return await self.inner.inventory_snapshots(installation)

    async def inject_loss(self, handle: SandboxHandle) -> None:
        await self.inner.inject_loss(handle)
        self._lost()

    async def aclose(self) -> None:
        await self.inner.aclose()


def process_metrics() -> OperatorMetrics:
    """The metrics of an operator process (what `dsb operator` serves on --metrics-port): the process and platform
    collectors, and the build info. The operator's application owns them (kube/process/application.py)."""
    metrics = OperatorMetrics()
    metrics.info.labels(version=_version()).set(1)
    return metrics
