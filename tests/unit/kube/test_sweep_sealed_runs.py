"""The orphan sweep takes a run for finished only from its sealed journal records (kube/store/finished.py), never
from a Journal head's labels or annotations, which a namespace's worker ServiceAccount may write: a forged status
label, a forged chain end, a forged seal or a rolled-back result leave the live run's sandbox in place, while a
genuinely finished run and a genuine chain end are still swept."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from durable_sandbox.engine.continue_as_new import CHAIN, CONTINUED_FROM, GENERATION
from durable_sandbox.engine.records import RunStatus
from durable_sandbox.kube.journal.sealing import Sealer, namespace_key
from durable_sandbox.kube.spec.plan import cluster_run_id
from durable_sandbox.kube.store import LABEL_STATUS, run_key
from durable_sandbox.kube.store.codec import ANNOTATION_RUN, head_name
from durable_sandbox.kube.store.finished import read_finished
from durable_sandbox.kube.store.journals import ApiServerJournal, JournalStores
from durable_sandbox.kube.sweep.sweeper import OrphanSweeper
from durable_sandbox.kube.telemetry.metrics import OperatorMetrics
from durable_sandbox.providers.contract import INSTALLATION_LABEL, SandboxSpec
from durable_sandbox.providers.local import LocalProvider
from tests.fakes.core_pods import FakeResponse
from tests.unit.kube.journal_heads_support import KEY, NS, Journal

LIVE, DONE = cluster_run_id("wf-live", "live-uid"), cluster_run_id("wf-done", "done-uid")


def _forged(head: dict[str, Any], run_id: str, status: str = "failed") -> dict[str, Any]:
    """``head``'s data under another run's name and annotation, labelled ``status``: what a writer of Journal
    objects can make without the key."""
    meta = head["metadata"]
    meta["name"] = head_name(run_id)
    meta["labels"] = {**meta["labels"], LABEL_STATUS: status, "durable-sandbox.dev/run-id": run_key(run_id)}
    meta["annotations"] = {ANNOTATION_RUN: run_id}
    return head


async def test_a_genuinely_finished_run_and_a_genuine_chain_end_are_finished() -> None:
    journal = Journal()
    await journal.run("done", RunStatus.SUCCEEDED)
    await journal.run("live", RunStatus.RUNNING)
    await journal.chain("long", RunStatus.SUCCEEDED, RunStatus.SUCCEEDED, RunStatus.FAILED)
    await journal.chain("going", RunStatus.SUCCEEDED, RunStatus.RUNNING)
    found = await read_finished(journal.heads)
    # A chain's end marks its first run (the Workflow's) finished; a run that continued is not finished itself.
    assert found.keys == {run_key("done"), run_key("long~2"), run_key("long")}
    assert found.ignored == ()


async def test_a_large_result_is_not_fetched_to_decide() -> None:
    """A result over 16 KiB is kept in blob objects: a continuation's result is a few bytes, so the sweep need not
    read them (one GET per such run per sweep otherwise)."""
    journal = Journal()
    await journal.run("big", RunStatus.SUCCEEDED, result="x" * 40_000)
    assert any(".b" in name for name in journal.objects.bodies), "the result went to blob objects"
    journal.objects.gets.clear()
    found = await read_finished(journal.heads)
    assert found.keys == {run_key("big")} and journal.objects.gets == []


async def test_a_forged_status_label_does_not_finish_a_live_run() -> None:
    journal = Journal()
    head = await journal.run("live", RunStatus.RUNNING)
    head["metadata"]["labels"][LABEL_STATUS] = "succeeded"
    journal.put(head)
    found = await read_finished(journal.heads)
    assert run_key("live") not in found.keys
    [(name, why)] = found.ignored
    assert name == head_name("live") and "its sealed record says 'running'" in why


async def test_a_forged_chain_end_does_not_finish_the_chains_first_run() -> None:
    """The labels alone once said: ``going~1`` continued (``going~2`` exists), ``going~2`` failed, so ``going``'s
    chain ended. ``going~2`` is forged: a genuine finished head's sealed values copied under its name, or values
    with no seal at all."""
    journal = Journal()
    await journal.chain("going", RunStatus.SUCCEEDED, RunStatus.RUNNING)
    done = await journal.run("done", RunStatus.FAILED)
    journal.put(_forged(done, "going~2"))
    unsealed = _forged(journal.head("done"), "going~3")
    unsealed["data"] = {k: v[23:] if v.startswith("~") else v for k, v in unsealed["data"].items()}
    journal.put(unsealed)
    found = await read_finished(journal.heads)
    assert found.keys == {run_key("done")}
    ignored = dict(found.ignored)
    assert set(ignored) == {head_name("going~2"), head_name("going~3")}
    assert "seal does not match" in ignored[head_name("going~2")]
    assert "carries no seal" in ignored[head_name("going~3")]


@pytest.mark.parametrize("key", [namespace_key(KEY, "team-b"), b"x" * 32], ids=["another-namespace", "no-key"])
async def test_a_head_sealed_with_any_other_key_is_ignored(key: bytes) -> None:
    """A worker of namespace team-b holds team-b's key only: nothing it seals opens in team-a."""
    journal = Journal()
    await journal.run("live", RunStatus.RUNNING)
    other = Journal(Sealer(key, NS, namespace_key=True))
    journal.put(await other.run("live", RunStatus.SUCCEEDED))  # the live run's head replaced by a forged one
    found = await read_finished(journal.heads)
    assert found.keys == frozenset()
    assert [name for name, _ in found.ignored] == [head_name("live")]
    assert "was changed by someone other than the operator" in found.ignored[0][1]


async def test_a_rolled_back_result_does_not_end_a_chain_whose_next_run_exists() -> None:
    """``going``'s result put back to the null the operator sealed when it created the run: sealed, and its status
    is terminal, but the run it continued as has a head, so its chain goes on."""
    journal = Journal()
    await journal.chain("going", RunStatus.SUCCEEDED, RunStatus.RUNNING)
    head = journal.head("going")
    head["data"]["run.result"] = Sealer(KEY, NS).seal(run_key("going"), "run.result", "null")
    journal.put(head)
    found = await read_finished(journal.heads)
    assert found.keys == frozenset() and found.ignored == ()


async def test_a_run_that_names_a_chain_it_is_not_the_continuation_of_does_not_end_it() -> None:
    """A finished run whose (sealed) ``continued-from`` names ``going``, which continued as another run: the
    link holds only where ``going``'s result names it, so ``going``'s chain is not taken as ended."""
    journal = Journal()
    await journal.chain("going", RunStatus.SUCCEEDED, RunStatus.RUNNING)
    await journal.run("intruder", RunStatus.FAILED, labels={CONTINUED_FROM: "going", CHAIN: "going", GENERATION: "1"})
    found = await read_finished(journal.heads)
    assert found.keys == {run_key("intruder")} and found.ignored == ()


async def test_a_copy_of_a_finished_head_under_another_name_is_ignored() -> None:
    journal = Journal()
    copy = await journal.run("done", RunStatus.SUCCEEDED)
    copy["metadata"]["name"] = "dsb.not-its-name"
    journal.put(copy)
    found = await read_finished(journal.heads)
    assert found.keys == {run_key("done")}
    assert [(name, "not the head of run 'done'" in why) for name, why in found.ignored] == [("dsb.not-its-name", True)]


class _ApiServer:
    """An API client that lists one namespace's Journal objects (``list_*_without_preload_content``), as the
    operator's ``KubernetesStore`` calls it; the label selector is evaluated by the journal's memory objects."""

    def __init__(self, journal: Journal) -> None:
        self.journal, self.custom = journal, self
        self.selectors: list[str] = []

    async def _list(self, selector: str) -> FakeResponse:
        self.selectors.append(selector)
        return FakeResponse(200, json.dumps({"items": await self.journal.objects.select(selector)}).encode())

    def list_namespaced_custom_object_without_preload_content(self, group: str, version: str, namespace: str,
                                                              plural: str, *, label_selector: str) -> Any:
        assert (namespace, plural) == (NS, "journals")
        return self._list(label_selector)


async def test_the_operators_journal_in_the_api_server_answers_the_sweep_from_sealed_heads() -> None:
    """``JournalStores.finished_runs``, what the sweep task calls, for the API-server journal: one LIST of the
    namespace's run heads, opened with the operator's journal key."""
    journal = Journal()
    await journal.run("done", RunStatus.SUCCEEDED)
    head = await journal.run("live", RunStatus.RUNNING)
    head["metadata"]["labels"][LABEL_STATUS] = "cancelled"
    journal.put(head)
    api = _ApiServer(journal)
    found = await JournalStores(ApiServerJournal(), api, journal_key=KEY).finished_runs(NS)  # type: ignore[arg-type]
    assert found.keys == {run_key("done")} and [name for name, _ in found.ignored] == [head_name("live")]
    assert api.selectors == ["durable-sandbox.dev/part=run"]
    keyless = await JournalStores(ApiServerJournal(), api, journal_key=b"another key").finished_runs(NS)  # type: ignore[arg-type]
    assert keyless.keys == frozenset(), "another operator's key opens nothing here"


class _Resources:
    def __init__(self, workflows: list[dict[str, Any]]) -> None:
        self.workflows = workflows

    async def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return list(self.workflows) if plural == "workflows" else []


class _NoRecords:
    async def all(self, namespace: str) -> dict[str, Any]:
        return {}


class _Events:
    def __init__(self) -> None:
        self.emitted: list[str] = []

    async def emit(self, obj: dict[str, Any], event: Any) -> bool:
        self.emitted.append(event.reason)
        return True


OURS = "ns-a/durable-sandbox"


def _sweeper(journal: Journal, provider: LocalProvider, workflows: list[dict[str, Any]], *,
             worker_keyed: bool = False) -> OrphanSweeper:
    """The operator's sweep of namespace ``NS`` over ``provider``, its Workflows ``workflows``, its journal
    ``journal``, and whether the namespace's key was handed to workers."""

    async def keyed(namespace: str) -> bool:
        return worker_keyed

    sweeper = OrphanSweeper(
        None, installation=OURS, namespaces=[NS], providers=lambda: {"local": provider}, grace=0.0,  # type: ignore[arg-type]
        events=_Events(), metrics=OperatorMetrics(process_collectors=False), records=_NoRecords(),  # type: ignore[arg-type]
        finished_runs=lambda namespace: read_finished(journal.heads), clock=lambda: 1000.0, worker_keyed=keyed)
    sweeper.objects = _Resources(workflows)  # type: ignore[assignment]
    return sweeper


def _wf(name: str, uid: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": NS, "name": name, "uid": uid}, "spec": spec}


async def _sandbox(provider: LocalProvider, uid: str) -> str:
    spec = SandboxSpec(owner=f"{NS}/{uid}", labels={INSTALLATION_LABEL: OURS})
    return (await provider.provision(spec, lease_seconds=600)).id


async def test_the_sweep_keeps_a_live_runs_sandbox_whatever_its_heads_say_and_says_each_forgery_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = Journal()
    await journal.chain(LIVE, RunStatus.SUCCEEDED, RunStatus.RUNNING)  # continued as new, going on
    head = journal.head(f"{LIVE}~1")
    head["metadata"]["labels"][LABEL_STATUS] = "succeeded"  # forged status label of the running run
    journal.put(head)
    journal.put(_forged(await journal.run("other", RunStatus.FAILED), f"{LIVE}~2"))  # forged chain end
    await journal.chain(DONE, RunStatus.SUCCEEDED, RunStatus.CANCELLED)  # genuinely ended chain
    provider = LocalProvider(tmp_path)
    live, done = await _sandbox(provider, "live-uid"), await _sandbox(provider, "done-uid")
    sweeper = _sweeper(journal, provider, [_wf("wf-live", "live-uid"), _wf("wf-done", "done-uid")])
    with caplog.at_level(logging.WARNING, logger="durable_sandbox.kube.sweep.sweeper"):
        first = await sweeper.sweep()
        second = await sweeper.sweep()
    assert [o.id for o in first["local"].destroyed] == [done] and second["local"].destroyed == ()
    assert [h.id for h in await provider.inventory_sandboxes(OURS)] == [live]
    said = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    assert len(said) == 2, said  # each forged head once, not at every sweep
    assert any(f"Journal {NS}/{head_name(f'{LIVE}~1')} is ignored" in m for m in said)
    assert any(f"Journal {NS}/{head_name(f'{LIVE}~2')} is ignored" in m for m in said)


async def test_where_workers_hold_the_namespace_key_only_worker_workflows_runs_are_taken_as_finished(
        tmp_path: Path) -> None:
    """A worker holds its namespace's key (kube/journal/worker_key.py), so it can seal a head as the operator does:
    there an operator-executed Workflow is never taken as finished by its journal (it keeps what it holds until it
    is deleted), while a worker Workflow's run, its team's word anyway, still is."""
    journal = Journal()
    await journal.run(LIVE, RunStatus.RUNNING)
    worker = Journal(Sealer(namespace_key(KEY, NS), NS, namespace_key=True))  # a worker's own store
    journal.put(await worker.run(LIVE, RunStatus.SUCCEEDED))  # the live run's head, sealed with the worker's key
    queued = cluster_run_id("wf-queued", "queued-uid")
    await journal.run(queued, RunStatus.SUCCEEDED)
    assert (await read_finished(journal.heads)).keys == {run_key(LIVE), run_key(queued)}, "the seal cannot tell"
    workflows = [_wf("wf-live", "live-uid"), _wf("wf-queued", "queued-uid", worker={"queue": "agents"})]
    for keyed_by, listed in (("the Secret", workflows[:1]), ("a worker Workflow", workflows)):
        provider = LocalProvider(tmp_path / keyed_by)
        live, queued_box = await _sandbox(provider, "live-uid"), await _sandbox(provider, "queued-uid")
        swept = await _sweeper(journal, provider, listed, worker_keyed=keyed_by == "the Secret").sweep()
        destroyed = [o.id for o in swept["local"].destroyed]
        assert live not in destroyed, f"keyed by {keyed_by}: the operator's run was taken as finished on a worker's seal"
        assert destroyed == [queued_box], keyed_by  # its run finished (or, not listed, its owner is gone)
    provider = LocalProvider(tmp_path / "no-worker")
    live = await _sandbox(provider, "live-uid")
    swept = await _sweeper(journal, provider, workflows[:1]).sweep()
    assert [o.id for o in swept["local"].destroyed] == [live], "no worker holds the key: the seal is the operator's"
