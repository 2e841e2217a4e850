"""The soak's verdict, from what the system left behind: each Workflow's end against its script, each run's
journal (KubernetesStore, as `dsb --kube history` reads it), the side-effect files, and the providers'
inventories. Every check returns problems (strings) instead of stopping at the first, so one failing seed
shows everything that went wrong."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

from durable_sandbox.engine.records import OperationRecord
from durable_sandbox.kube.store import KubernetesStore
from tests.soak.driver import Tracked
from tests.soak.workloads import effect_order, effects_file, expected_result_problems


def load_journals(kubeconfig: Path, namespace: str, run_ids: list[str]) -> dict[str, list[OperationRecord]]:
    async def load() -> dict[str, list[OperationRecord]]:
        store = await KubernetesStore.connect(namespace, kubeconfig=str(kubeconfig))
        try:
            return {run_id: await store.load_journal(run_id) for run_id in run_ids}
        finally:
            await store.close()

    return asyncio.run(load())


def end_problems(t: Tracked) -> list[str]:
    """The end each Workflow's script implies."""
    s = t.script
    name = s.name
    if s.expected == "Gone":
        return [] if t.gone and t.acted else [f"{name}: expected deleted mid-run and gone (acted={t.acted}, gone={t.gone})"]
    if t.gone or t.final is None:
        return [f"{name}: disappeared, expected phase {s.expected}"]
    st = t.final.get("status") or {}
    if st.get("phase") != s.expected:
        return [f"{name}: phase {st.get('phase')}, expected {s.expected}; error: {st.get('error')}"]
    problems = []
    if s.kind == "suspend" and not t.saw_suspended:
        problems.append(f"{name}: succeeded without ever being Suspended after spec.suspend")
    if s.expected == "Succeeded":
        problems += [f"{name}: {p}" for p in expected_result_problems(s, st.get("result") or {})]
    return problems


def journal_problems(name: str, rows: list[OperationRecord], effects: Path, order: list[str]) -> list[str]:
    """No gap or duplicate in the journal, no operation completed twice, and no committed call or step run
    again. A run executes its calls and steps one after the other, each starting once the previous one's
    completion is committed, so in the effects file a call may repeat right away (it was in flight when its
    worker died: at least once), but an earlier call appearing after a later one ran means a committed call
    ran again. That is allowed only as a recovery replay: each sandbox restore may replay completed calls
    into the restored workspace once, in order."""
    problems = []
    seqs = [r.seq for r in rows]
    if seqs != list(range(1, len(rows) + 1)):
        problems.append(f"{name}: journal seqs are not 1..{len(rows)} without gaps or duplicates: {seqs}")
    completed = Counter(r.op_id for r in rows if r.status == "completed")
    twice = sorted(o for o, n in completed.items() if n > 1)
    if twice:
        problems.append(f"{name}: operations completed more than once: {twice}")
    restores = sum(1 for r in rows if r.kind == "sandbox.restore" and r.status == "started")
    executed = effects.read_text().split() if effects.exists() else []
    rank = {token: i for i, token in enumerate(order)}
    unknown = sorted(set(executed) - set(rank))
    if unknown:
        problems.append(f"{name}: side effects of no call or step of this Workflow: {unknown}")
        return problems
    rewinds = sum(1 for prev, cur in pairwise(executed) if rank[cur] < rank[prev])
    if rewinds > restores:
        problems.append(f"{name}: a committed call or step ran again: executions {executed} go back {rewinds} "
                        f"time(s), but the journal has {restores} sandbox restore(s) that may replay calls")
    return problems


def run_problems(tracked: list[Tracked], kubeconfig: Path, namespace: str, effects_dir: Path) -> list[str]:
    problems = [p for t in tracked for p in end_problems(t)]
    runs = {t.script.name: (t.final.get("status") or {}).get("runId") for t in tracked if t.final is not None}
    journals = load_journals(kubeconfig, namespace, [r for r in runs.values() if r])
    for t in tracked:
        run_id = runs.get(t.script.name)
        if run_id is None:
            continue
        rows = journals.get(run_id) or []
        # Kept beside the effects for whoever replays a failing seed.
        (effects_dir.parent / "journals").mkdir(exist_ok=True)
        (effects_dir.parent / "journals" / f"{t.script.name}.txt").write_text("".join(
            f"{r.seq} {r.op_id} {r.kind} {r.status} {json.dumps(r.meta) if r.meta else ''}\n" for r in rows))
        if not rows:
            problems.append(f"{t.script.name}: run {run_id} has an empty journal")
            continue
        problems += journal_problems(t.script.name, rows, effects_file(effects_dir, t.script), effect_order(t.script))
    return problems


def retained_snapshots(tracked: list[Tracked]) -> dict[str, int]:
    """Snapshots a succeeded run keeps on purpose (retainLatestSnapshot), per provider."""
    kept: Counter[str] = Counter()
    for t in tracked:
        st: dict[str, Any] = (t.final or {}).get("status") or {}
        if t.script.retain and st.get("phase") == "Succeeded" and st.get("latestSnapshot"):
            kept[t.script.provider] += 1
    return dict(kept)


def snapshot_owners(tracked: list[Tracked], kubeconfig: Path, namespace: str, keys: set[str]) -> list[str]:
    """For whoever replays a seed that left snapshots: the Workflow each owner key (a provider's tag of
    ``<namespace>/<uid>``) belongs to, its script and end, and its journal's sandbox rows."""
    from durable_sandbox.kube.api.objects import owner_tag
    from durable_sandbox.kube.spec.plan import cluster_run_id
    from durable_sandbox.providers.contract import tag_key

    found: list[str] = []
    for t in tracked:
        meta = (t.final or {}).get("metadata") or {}
        uid = meta.get("uid")
        if not uid or tag_key(owner_tag(namespace, uid)) not in keys:
            continue
        run_id = cluster_run_id(meta["name"], uid)
        rows = load_journals(kubeconfig, namespace, [run_id]).get(run_id, [])
        sandbox_rows = [(r.op_id, r.status, r.meta, r.result) for r in rows if r.kind.startswith("sandbox")]
        found.append(f"owner {tag_key(owner_tag(namespace, uid))} is {meta['name']} ({t.script}), ended "
                     f"{((t.final or {}).get('status') or {}).get('phase')}; its sandbox rows: {sandbox_rows}")
    return found
