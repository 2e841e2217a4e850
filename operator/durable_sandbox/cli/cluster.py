"""`dsb --kube run`: apply a manifest and follow each Workflow's run until it settles, shown as a local run is.

The cluster's runs themselves (inspect, history, stream, runs, signal, cancel) are opened by
:mod:`durable_sandbox.runs.cluster`, which the web view shares.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from pathlib import Path

import click

from durable_sandbox.cli.drive import with_display
from durable_sandbox.cli.render import emit_data
from durable_sandbox.engine import RunState
from durable_sandbox.kube.spec.manifests import load_manifests
from durable_sandbox.kube.spec.models import Resource
from durable_sandbox.kube.spec.workflows import run_id_of
from durable_sandbox.runs.cluster import POLL_SECONDS, ClusterEngine, not_started_state
from durable_sandbox.runs.errors import CliError
from durable_sandbox.runs.settings import Settings

# Phases after which `dsb --kube run` stops following (the operator keeps a waiting run and resumes it).
SETTLED_PHASES = frozenset({"Succeeded", "Failed", "Cancelled", "Waiting", "Suspended"})
# How long `run` waits before saying that no operator has picked the Workflow up yet (it keeps waiting).
NO_OPERATOR_HINT_SECONDS = 15.0


async def follow(cluster: ClusterEngine, name: str) -> RunState:
    """Wait until the Workflow settles (finished, waiting or suspended) and return its run's state."""
    started = time.monotonic()
    hinted = False
    while True:
        obj = await cluster.workflows.get(name)
        if obj is None:
            raise CliError(f"Workflow {cluster.namespace}/{name} was deleted while it ran", code=1)
        rid = run_id_of(obj)
        status = obj.get("status") or {}
        run = await cluster.store.get_run(rid)
        phase = status.get("phase")
        current = status.get("observedGeneration") in (None, obj["metadata"].get("generation"))
        if phase in SETTLED_PHASES and current:
            if run is None:  # rejected before a run existed (a policy, an invalid spec)
                return not_started_state(rid, obj)
            state = await cluster.client.inspect(rid)
            if phase not in ("Waiting", "Suspended") or state.status not in ("pending", "running"):
                return state
        if run is None and not hinted and time.monotonic() - started > NO_OPERATOR_HINT_SECONDS:
            hinted = True
            click.echo(
                f"warning: no operator has started Workflow {cluster.namespace}/{name} yet; is `dsb operator` "
                f"running for this cluster? (still waiting; Ctrl-C stops waiting, the Workflow stays)",
                err=True,
            )
        await asyncio.sleep(POLL_SECONDS)


def load(target: str) -> list[Resource]:
    """The resources of a manifest file ('-': stdin), validated by the same models as `dsb run` and the operator."""
    if target == "-":
        return load_manifests(sys.stdin.read(), source="<stdin>")
    if not Path(target).is_file():
        raise CliError(f"{target}: no such manifest file")
    return load_manifests(Path(target))


async def run_manifest(settings: Settings, resources: list[Resource], *, detach: bool) -> list[RunState]:
    """`dsb --kube run FILE`: apply the manifest's resources (server-side; Sandboxes first) and follow each
    Workflow's run until it settles, shown as a local run is. With ``detach``, apply and return []."""
    # What the manifest says, as written (validated by the same models as `dsb run` and the operator).
    ordered = sorted(resources, key=lambda r: r.kind != "Sandbox")
    docs = [r.model_dump(mode="json", by_alias=True, exclude_unset=True) for r in ordered]
    states: list[RunState] = []
    async with ClusterEngine.open(settings) as cluster:
        applied = [await cluster.apply(doc) for doc in docs]
        workflows = [obj for obj in applied if obj.get("kind") == "Workflow"]
        for obj in workflows:
            name, rid = obj["metadata"]["name"], run_id_of(obj)
            if settings.output == "table":
                click.echo(f"run {rid} (Workflow/{name} in namespace {cluster.namespace}{', applied' if detach else ''})")
            if detach:
                continue
            states.append(
                await with_display(cluster, settings, rid, f"Workflow/{name}", functools.partial(follow, cluster, name))
            )
        if detach and settings.output == "table":
            click.echo(f"follow with `{settings.dsb()} logs -f NAME`, inspect with `{settings.dsb()} inspect NAME`")
        elif detach:
            emit_data(settings, [{"runId": run_id_of(o), "workflow": o["metadata"]["name"]} for o in workflows])
    return states
