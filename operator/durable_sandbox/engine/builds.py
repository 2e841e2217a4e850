"""Worker builds: which build of a team's code may execute a run (versions in flight).

A worker advertises a *build id* (``dsb worker --build-id``, default ``$DSB_BUILD_ID``; a worker given none is
*unversioned*). The engine carries it as the extension value :class:`WorkerBuild`. A versioned executor records
its build in the run's labels (``BUILD_LABEL``) when it executes a run that records none, in the same write that
marks the run running: the build that started the run. From then on:

- a worker of the same build executes the run as always;
- a worker of another build leaves it alone (:class:`PinnedToBuild`, a ``NotRunnableHere``: the run is not
  failed, its claim is kept until its lease runs out, like a run whose module this process cannot import), and
  says so, naming the build the run waits for;
- unless the workflow this worker imports is declared ``@workflow(versioning="auto-upgrade")``: its code guards
  every change with ``ctx.patched`` (engine/runtime.py: a fresh execution takes the new path and journals a
  marker, a replay of an old history takes the path its history took), so this worker executes it, replaying
  the old build's history, and re-pins the run to its own build in the same write, the old one added to
  ``PAST_BUILDS_LABEL``: a worker of a build the run has been on before never takes it back (its code may not
  know what the newer build journaled), whatever its workflow declares.

Unversioned executors (``dsb run``, ``dsb resume``, the operator's built-in flows, a worker without a build id)
neither record nor check builds: what they execute is what existed before builds did.

Claims: the cluster worker (kube/workers/runner.py) checks a run's build before it claims it, so it never holds
another build's run. The store poller behind a local ``dsb worker`` (engine/sources.py) hands the store a
:class:`BuildClaims` (:func:`claims_of`) and ``claim_next`` skips the runs it does not admit, in the store's own
query (stores/sql_rules.py renders :func:`may_take` as SQL; the Kubernetes store calls :meth:`BuildClaims.admits`):
a worker of another build never holds a run pinned to this one, so a worker of the run's build gets it at once.
The one thing a store cannot see is the ``versioning`` of a workflow this worker has not imported yet: such a
run is handed out (it may be auto-upgrade), the executor imports and decides under the lease as below, and a
refusal gives the claim back at once (from then on the workflow is known here to be pinned, and skipped).

The decision is made before any of the workflow's code runs (a run's history is never replayed by a build that
would refuse it), and the executor re-checks it under the run's lease: a worker of another build that claimed
the run in between sees the label it wrote.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from durable_sandbox.engine.errors import NotRunnableHere, WorkflowNotFound
from durable_sandbox.engine.records import RunRecord
from durable_sandbox.engine.workflow import WorkflowDefinition, registered

__all__ = [
    "BUILD_ENV",
    "BUILD_LABEL",
    "PAST_BUILDS_LABEL",
    "BuildClaims",
    "PinnedToBuild",
    "WorkerBuild",
    "build_from_env",
    "build_labels",
    "claims_of",
    "may_take",
    "past_builds",
    "pinned_build",
    "refusal",
]

BUILD_LABEL = "durable-sandbox.dev/build"  # the run label that names the build that started (or took over) the run
PAST_BUILDS_LABEL = "durable-sandbox.dev/past-builds"  # the builds it was pinned to before (comma-separated)
BUILD_ENV = "DSB_BUILD_ID"  # a worker's default build id (the example Dockerfile sets it from a build argument)
_BUILD_ID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")  # a Kubernetes label value, not empty


@dataclass(frozen=True)
class WorkerBuild:
    """This worker's build id, given to the engine as an extension value (``Engine(..., extensions=[...])``)."""

    build_id: str

    def __post_init__(self) -> None:
        if not _BUILD_ID.fullmatch(self.build_id):
            raise ValueError(
                f"build id {self.build_id!r} is not usable: give 1 to 63 letters, digits, '.', '_' or '-', starting "
                f"and ending with a letter or digit (a git commit or an image tag, e.g. 'v1.4.2' or 'a1b2c3d')")


def build_from_env(given: str | None, env: Mapping[str, str] | None = None) -> WorkerBuild | None:
    """The build of ``--build-id`` if given, else ``$DSB_BUILD_ID``; None (unversioned) when neither is set."""
    value = given if given is not None else (env if env is not None else os.environ).get(BUILD_ENV)
    return WorkerBuild(value) if value else None


def pinned_build(run: RunRecord) -> str | None:
    """The build the run is pinned to (None: no versioned worker has executed it)."""
    return run.labels.get(BUILD_LABEL) or None


def past_builds(run: RunRecord) -> list[str]:
    """The builds the run was pinned to before its current one, oldest first."""
    return [b for b in (run.labels.get(PAST_BUILDS_LABEL) or "").split(",") if b]


class PinnedToBuild(NotRunnableHere):
    """The run is pinned to another build than this worker's; it is left as it is for a worker of that build."""

    def __init__(self, run_id: str, message: str, *, pinned: str, build: str) -> None:
        super().__init__(run_id, WorkflowNotFound(message))
        self.pinned = pinned
        self.build = build
        self.args = (message,)

    def __str__(self) -> str:
        return str(self.args[0])


def may_take(pinned: str | None, past: Sequence[str], build: str, upgrades: bool) -> bool:
    """The decision, in one place: whether a worker of ``build`` may execute a run pinned to ``pinned`` (None: to
    no build) that was on the builds ``past`` before, its workflow declared auto-upgrade (``upgrades``) here.
    stores/sql_rules.py ``build_sql`` says the same in SQL; the store contract kit checks they agree."""
    if not pinned or pinned == build:
        return True
    return upgrades and build not in past


@dataclass(frozen=True)
class BuildClaims:
    """Which runs ``Store.claim_next`` may hand a worker of ``build_id``: those :func:`may_take` admits, a
    workflow counted as auto-upgrade unless it is one of ``pinned_workflows`` (the workflows this worker has
    imported that are not auto-upgrade; one it has not imported may be, and is decided after the claim)."""

    build_id: str
    pinned_workflows: frozenset[str] = frozenset()

    def admits(self, run: RunRecord) -> bool:
        """Whether ``claim_next`` may hand ``run`` to this worker."""
        return self.admits_labels(run.workflow, run.labels)

    def admits_labels(self, workflow: str, labels: Mapping[str, str]) -> bool:
        """:meth:`admits` of a run of ``workflow`` with run labels ``labels``."""
        past = [b for b in str(labels.get(PAST_BUILDS_LABEL) or "").split(",") if b]
        return may_take(str(labels.get(BUILD_LABEL) or "") or None, past, self.build_id,
                        workflow not in self.pinned_workflows)


def claims_of(build: WorkerBuild | None) -> BuildClaims | None:
    """What a worker of ``build`` may claim, by the workflows imported in this process now (None: unversioned,
    any run)."""
    if build is None:
        return None
    return BuildClaims(build.build_id, frozenset(d.name for d in registered() if d.versioning != "auto-upgrade"))


def refusal(run: RunRecord, definition: WorkflowDefinition, build: WorkerBuild | None) -> str | None:
    """Why a worker of ``build`` must not execute ``run`` (None: it may)."""
    pinned = pinned_build(run)
    if build is None or may_take(pinned, past_builds(run), build.build_id, definition.versioning == "auto-upgrade"):
        return None
    assert pinned is not None
    if build.build_id in past_builds(run):
        return (f"run {run.run_id!r} (workflow {run.workflow!r}) moved from build {build.build_id!r}, this worker's, "
                f"to build {pinned!r}: a run never moves back to an older build (its history may hold what the older "
                f"code does not know); it waits for a worker of build {pinned!r} or a newer one")
    return (f"run {run.run_id!r} (workflow {run.workflow!r}) is pinned to build {pinned!r} and this worker runs build "
            f"{build.build_id!r}: it waits for a worker of build {pinned!r} (keep one running until its runs finish), "
            f"or declare the workflow @workflow(versioning=\"auto-upgrade\") with its changes guarded by ctx.patched "
            f"to let newer builds take it over")


def build_labels(run: RunRecord, definition: WorkflowDefinition, build: WorkerBuild | None) -> dict[str, str] | None:
    """The run's labels with ``build`` recorded as its build (None when it is recorded already, or the worker is
    unversioned); ``PinnedToBuild`` when this worker must leave the run alone."""
    why = refusal(run, definition, build)
    if why is not None:
        assert build is not None
        raise PinnedToBuild(run.run_id, why, pinned=pinned_build(run) or "", build=build.build_id)
    if build is None or pinned_build(run) == build.build_id:
        return None
    pinned = pinned_build(run)
    moved = {PAST_BUILDS_LABEL: ",".join([*past_builds(run), pinned])} if pinned is not None else {}
    return {**run.labels, BUILD_LABEL: build.build_id, **moved}
