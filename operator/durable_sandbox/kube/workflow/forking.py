"""``Workflow.spec.forkOf: {workflow: NAME, afterCall: N}``: a Workflow whose run starts as a fork of another's.

Admission makes the run (instead of creating it empty) with the run-fork mechanism (sandboxes/fork.py): the new
run's journal starts with a ``fork`` record naming the source Workflow by name **and uid** (as the API server gave
them, read in the fork's own namespace: never another's) and its run, then the source's records up to its Nth
sandbox call; its sandbox is rebuilt at that state (the newest snapshot of the source at or before N restored when
the provider can, else a fresh sandbox; the calls since replayed with the outcome check) and takes a snapshot of
its own before it lets the source's go. Only then is the run made runnable, and the operator drives it like any
other: ``sandbox-agent`` over the source's first N tool calls (answered from the journal) and then the fork's own
``toolCalls`` (the new tail), in the rebuilt sandbox.

The fork's env is its own spec's (literal values and Secrets of its namespace), never the source's: a source's
call that set env values cannot be carried into a fork (refused). A diverging replay refuses the fork with expected
vs actual, and nothing of it is left (no run, sandbox or snapshot). A fork whose maker died half-way (its run still
``waiting`` on nothing) is undone and made again at the next admission.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from durable_sandbox.engine.errors import LeaseHeld
from durable_sandbox.engine.records import RunRecord, RunStatus
from durable_sandbox.kube.spec.plan import RunPlan, cluster_run_id
from durable_sandbox.kube.store import OwnerRef
from durable_sandbox.sandbox_engine import Engine
from durable_sandbox.sandboxes.fork import (
    ForkDiverged,
    ForkPlace,
    ForkRefused,
    ForkRunExists,
    fork_run,
    undo_fork,
)
from durable_sandbox.sandboxes.session import SessionState
from durable_sandbox.workflows import sandbox_agent

__all__ = ["SESSION", "ForkOfBusy", "ForkOfRefused", "half_made", "make_fork"]

SESSION = "sandbox"  # sandbox-agent's session


class ForkOfRefused(ValueError):
    """The fork cannot be made as its spec says (a final refusal: ``reason`` is the condition's)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ForkOfBusy(RuntimeError):
    """Another replica is making this fork now (it holds the run's lease, or created the run first): look again."""


def half_made(run: RunRecord) -> bool:
    """A fork run left by a maker that died before it was ready: created waiting, on nothing (sandbox-agent waits
    on nothing else than a replay's ``ask`` answer, which a made fork has pending)."""
    return run.status == RunStatus.WAITING and not run.pending_callbacks and run.wake_at is None


async def make_fork(
    engine: Engine, plan: RunPlan, *, namespace: str, run_id: str, owner: OwnerRef,
    source: Mapping[str, Any] | None, secrets: Mapping[tuple[str, str], str] | None,
    stored: RunRecord | None = None,
) -> RunRecord:
    """Make run ``run_id`` (owned by ``owner``) as the fork ``plan.fork_of`` asks for; ``source`` is the object the
    API server has by that name in ``namespace`` (None: none). ``stored``: a half-made fork of an earlier attempt,
    undone first. Raises :class:`ForkOfRefused` with what was wrong and what to do."""
    fork = plan.fork_of
    assert fork is not None
    where = f"{plan.where}spec.forkOf"
    meta = (source or {}).get("metadata") or {}
    uid = meta.get("uid")
    if source is None or not uid:
        raise ForkOfRefused("ForkSourceNotFound", f"{where}.workflow: Workflow {fork.workflow!r} does not exist in "
                            f"namespace {namespace!r}; a fork's source is a Workflow of its own namespace (create the "
                            f"fork again naming one)")
    source_run = cluster_run_id(fork.workflow, str(uid))
    src = await engine.store.get_run(source_run)
    if src is None:
        raise ForkOfRefused("ForkSourceNotStarted", f"{where}.workflow: Workflow {fork.workflow!r} (uid {uid}) has "
                            f"no run yet; create the fork again once the source has run {fork.after_call} call(s)")
    if src.workflow != sandbox_agent.NAME or not isinstance(src.input, dict):
        raise ForkOfRefused("ForkSourceNotToolCalls", f"{where}.workflow: Workflow {fork.workflow!r} runs "
                            f"{src.workflow!r}, not toolCalls; forkOf forks a toolCalls Workflow (fork a code-first "
                            f"run with `dsb run --fork-of`)")
    rows = await engine.store.load_journal(source_run)
    state = SessionState.derive(SESSION, rows)
    if fork.after_call > state.completed:
        raise ForkOfRefused("ForkPointNotReached", f"{where}.afterCall is {fork.after_call}, but Workflow "
                            f"{fork.workflow!r}'s run completed {state.completed} sandbox call(s); create the fork "
                            f"with afterCall between 0 and {state.completed}, or once the source got that far")
    if state.provider is not None and plan.provider is not None and state.provider != plan.provider:
        raise ForkOfRefused("ForkProviderDiffers", f"{plan.where}spec.sandbox.provider is {plan.provider!r}, but "
                            f"Workflow {fork.workflow!r} ran in provider {state.provider!r}; a fork continues in its "
                            f"source's provider (name it, or leave it unset when it is the default)")
    program = _whole_program(plan, src.input, where)
    env = _own_env(plan, secrets, where)
    try:
        if stored is not None:  # a maker that died half-way: nothing of it is kept
            await undo_fork(engine, stored.run_id)
        return await _fork(engine, plan, source_run, str(uid), run_id, owner, program, env)
    except (LeaseHeld, ForkRunExists) as exc:  # never undone here: it is another replica's to finish
        raise ForkOfBusy(f"{where}: another operator replica is making this fork ({exc}); looked at again") from None


async def _fork(engine: Engine, plan: RunPlan, source_run: str, uid: str, run_id: str, owner: OwnerRef,
                program: dict[str, Any], env: dict[str, str]) -> RunRecord:
    fork = plan.fork_of
    assert fork is not None
    where = f"{plan.where}spec.forkOf"
    store: Any = engine.store  # a KubernetesStore: the run's objects are owned by the Workflow

    async def create(record: RunRecord) -> tuple[RunRecord, bool]:
        made: tuple[RunRecord, bool] = await store.create_run(record, owner=owner)
        return made

    place = ForkPlace(labels=dict(plan.labels), create=create, env=env, origin={"workflow": fork.workflow, "uid": uid})
    try:
        await fork_run(engine, source_run, after_call=fork.after_call, session=SESSION, workflow=plan.definition,
                       input=program, run_ids=[run_id], place=place)
    except ForkDiverged as exc:
        raise ForkOfRefused("ForkDiverged", f"{where}: {exc}") from None
    except ForkRunExists:
        raise
    except ForkRefused as exc:
        raise ForkOfRefused("ForkRefused", f"{where}: {exc}") from None
    run = await engine.store.get_run(run_id)
    assert run is not None
    return run


def _whole_program(plan: RunPlan, source_input: dict[str, Any], where: str) -> dict[str, Any]:
    """The fork run's sandbox-agent input: the source's first afterCall tool calls (as its run stored them: the
    replay answers them from the journal), then the fork's own; every other setting the fork's."""
    fork = plan.fork_of
    assert fork is not None and isinstance(plan.input, dict)
    head = list(source_input.get("toolCalls") or [])[: fork.after_call]
    for i, call in enumerate(head):
        if isinstance(call, dict) and call.get("env"):
            raise ForkOfRefused("ForkRefused", f"{where}: the source's toolCalls[{i}] sets env values, which no "
                                f"journal keeps (they may be secrets), so a fork cannot carry it; fork before it, "
                                f"or set the value in the fork's sandbox.env")
    whole = {**plan.input, "toolCalls": head + list(plan.input.get("toolCalls") or [])}
    try:
        sandbox_agent.SandboxAgentInput.model_validate(whole)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ForkOfRefused("InvalidSpec", f"{where}: the source's first {fork.after_call} call(s) and this "
                            f"Workflow's toolCalls together are not a valid run: {err.get('msg')}") from None
    return whole


def _own_env(plan: RunPlan, secrets: Mapping[tuple[str, str], str] | None, where: str) -> dict[str, str]:
    """The fork's sandbox env: its spec's (values and its namespace's Secrets), never its source's."""
    if plan.sandbox is None:
        return {}
    try:
        return sandbox_agent.resolve_env(plan.sandbox, secrets)
    except ValueError as exc:
        raise ForkOfRefused("SecretMissing", f"{where}: {exc}") from None
