"""The run page's timeline (ui/timeline.py) folded from real journals: every attempt of a step and its
backoff, parallel branches on lanes of their own, sandbox loss, the restore and the calls it replayed
(marked, in order, pointing at the calls they reproduce), a callback waiting then signalled."""

from __future__ import annotations

from typing import Any

import pytest

from durable_sandbox import Engine
from durable_sandbox.engine.records import Event, OperationRecord
from durable_sandbox.stores import SqliteStore
from durable_sandbox.ui.timeline import Item, Timeline, session_of
from tests.unit import ui_flows


async def timeline_of(store: SqliteStore, run_id: str) -> Timeline:
    run = await store.get_run(run_id)
    assert run is not None
    tl = Timeline(run.created_at)
    tl.feed(await store.load_journal(run_id), await store.read_events(run_id))
    return tl


@pytest.fixture
async def waiting_run(store: SqliteStore) -> tuple[Engine, str]:
    engine = Engine(store, worker_id="ui-test")
    ui_flows.ATTEMPTS.clear()
    state = await engine.run(ui_flows.everything, {"key": "t"}, run_id="ui-t")
    assert state.status == "waiting", state.error
    yield engine, "ui-t"
    await engine.aclose()


def by_kind(items: list[Item], kind: str) -> list[Item]:
    return [i for i in items if i.kind == kind]


async def test_loss_restore_and_replayed_calls_are_in_order(store: SqliteStore, waiting_run: tuple[Engine, str]) -> None:
    _, run_id = waiting_run
    tl = await timeline_of(store, run_id)
    items = [i for i in tl.sorted_items() if i.lane == 0 and i.src == 0]
    sandbox = [(i.kind, i.outcome, i.label) for i in items if i.op and i.op.startswith("ws/")]
    assert sandbox == [
        ("provision", "ok", "provision (local)"),
        ("call", "ok", "write_file: a.txt"),
        ("call", "ok", "shell: echo two >> a.txt"),
        ("snapshot", "ok", "snapshot after 2 calls"),
        ("call", "ok", "shell: echo three >> a.txt"),
        ("loss", "warning", "sandbox lost (injected after 3 calls)"),
        ("destroy", "warning", sandbox[6][2]),
        ("restore", "ok", sandbox[7][2]),
        ("call", "replayed", "shell: echo three >> a.txt"),
        ("call", "ok", "shell: cat a.txt"),
        ("snapshot", "ok", "snapshot after 4 calls"),
        ("snapshot-delete", "ok", sandbox[11][2]),
        ("destroy", "ok", sandbox[12][2]),
        ("snapshot-delete", "ok", sandbox[13][2]),
        ("finalize", "ok", "finalize: snapshots deleted, sandbox destroyed"),
    ]
    assert "(lost)" in sandbox[6][2]
    assert sandbox[7][2].startswith("recovery from lsnap-")
    [restore] = by_kind(items, "restore")
    [replayed] = [i for i in items if i.outcome == "replayed"]
    original = tl.items[replayed.of or ""]
    assert (original.op, original.outcome, original.exit) == (replayed.op, "ok", 0)
    assert restore.t0 <= replayed.t0 <= (replayed.t1 or 0) <= (restore.t1 or 0)
    assert restore.note == "replayed 1 call into the new sandbox"
    # The loss notice the session emits is an event item, next to the journal's loss.
    [lost] = by_kind(tl.sorted_items(), "lost")
    assert lost.src == 1 and "loss injected" in lost.label


async def test_each_attempt_is_a_segment_with_its_backoff(store: SqliteStore, waiting_run: tuple[Engine, str]) -> None:
    _, run_id = waiting_run
    tl = await timeline_of(store, run_id)
    flaky = [i for i in tl.sorted_items() if i.op == "flaky"]
    assert [(i.kind, i.outcome, i.attempt) for i in flaky] == [
        ("step", "retrying", 1), ("backoff", "waiting", 1), ("step", "ok", 2)]
    first, backoff, second = flaky
    assert first.note == "ConnectionError: the first attempt fails"
    assert backoff.t0 == first.t1 and backoff.t1 == second.t0  # the backoff ends when attempt 2 starts
    assert [first.key, second.key] == ["flaky", "flaky#2"]
    nap = tl.items["nap"]
    assert (nap.kind, nap.outcome, nap.label) == ("timer", "ok", "sleep nap") and (nap.t1 or 0) > nap.t0


async def test_parallel_branches_get_lanes_of_their_own(store: SqliteStore, waiting_run: tuple[Engine, str]) -> None:
    _, run_id = waiting_run
    tl = await timeline_of(store, run_id)
    assert [(lane.id, lane.label, lane.parent) for lane in tl.lanes] == [
        ("", "run", -1), ("fan/left", "left", 0), ("fan/right", "right", 0)]
    lanes = {i.op: i.lane for i in tl.sorted_items() if i.op and i.op.startswith("fan")}
    assert lanes == {"fan": 0, "fan/left/inner": 1, "fan/left": 1, "fan/right/inner": 2, "fan/right": 2}
    assert {i.kind for i in tl.items.values() if i.op in ("fan/left", "fan/right")} == {"branch"}


async def test_a_waiting_callback_then_its_signal_arrive_as_changes(
    store: SqliteStore, waiting_run: tuple[Engine, str]
) -> None:
    engine, run_id = waiting_run
    tl = await timeline_of(store, run_id)
    assert (tl.items["approve"].kind, tl.items["approve"].outcome, tl.items["approve"].t1) == ("callback", "waiting", None)
    op_seq, ev_seq = tl.op_seq, tl.ev_seq
    await engine.signal(run_id, "approve", {"ok": True})
    state = await engine.resume(run_id)
    assert state.status == "succeeded"
    changed = tl.feed(await store.journal_since(run_id, op_seq), await store.read_events(run_id, ev_seq))
    by_key = {i.key: i for i in changed}
    assert by_key["approve"].outcome == "ok" and by_key["approve"].t1 is not None
    kinds = [i.kind for i in changed]
    assert "signal" in kinds and kinds.count("run") >= 2  # resumed, succeeded
    assert len(changed) == len(by_key)  # each changed item once
    # Feeding the same rows again changes nothing.
    assert tl.feed(await store.journal_since(run_id, 0), await store.read_events(run_id, 0)) == []


def test_kubernetes_events_of_the_workflow_are_items_and_update_in_place() -> None:
    tl = Timeline(100.0)
    ev: dict[str, Any] = {"uid": "u1", "ts": 105.0, "reason": "Suspended", "message": "spec.suspend is true",
                          "type": "Normal", "count": 1}
    [item] = tl.feed(k8s_events=[ev])
    assert (item.kind, item.label, item.src) == ("suspend", "Suspended: spec.suspend is true", 2)
    assert tl.feed(k8s_events=[ev]) == []
    [again] = tl.feed(k8s_events=[{**ev, "count": 2}])
    assert again.key == item.key and again.label.endswith("(x2)")


@pytest.mark.parametrize(("op_id", "kind", "session"), [
    ("sandbox/provision", "sandbox.provision", "sandbox"),
    ("fan/a/ws/dsv1_abc", "sandbox.call", "fan/a/ws"),
    ("ws/snapshot/4", "sandbox.snapshot", "ws"),
    ("ws/snapshot/4/delete", "sandbox.snapshot_delete", "ws"),
    ("ws/restore/1", "sandbox.restore", "ws"),
    ("ws/inject_loss/3", "sandbox.inject_loss", "ws"),
    ("ws/destroy/lsb-1", "sandbox.destroy", "ws"),
    ("ws/finalize", "sandbox.destroy", "ws"),
    ("greet", "step", None),
])
def test_session_of(op_id: str, kind: str, session: str | None) -> None:
    assert session_of(op_id, kind) == session


def test_a_step_its_crashed_worker_left_open_ends_at_its_last_record_and_runs_again_as_a_new_item() -> None:
    """A worker killed (no record of why) while a step ran: the next worker starts the same attempt again. The
    first run ends at the dead worker's last record, not when the next one started; the second is its own item.
    Fed in two parts, as a live page reads them."""
    step = OperationRecord("build", "step", "build", "started", ts=12.0, seq=2)
    tl = Timeline(10.0)
    tl.feed([OperationRecord("a", "step", "a", "completed", ts=11.0, seq=1), step], [Event("r", "run.started", ts=10.0, seq=1)])
    assert tl.items["build"].outcome == "running"
    tl.feed([OperationRecord("build", "step", "build", "started", ts=31.0, seq=3),
             OperationRecord("build", "step", "build", "completed", ts=33.0, seq=4)],
            [Event("r", "run.resumed", ts=30.0, seq=2)])
    first, second = tl.items["build"], tl.items["build#2"]
    assert (first.outcome, first.t0, first.t1) == ("interrupted", 12.0, 12.0)
    assert (second.outcome, second.t0, second.t1, second.rerun) == ("ok", 31.0, 33.0, True)


def test_what_a_waiting_run_left_open_is_not_interrupted_when_it_resumes() -> None:
    """A run that said it waits (inside a parallel, here) and is resumed later was not interrupted: one item."""
    tl = Timeline(10.0)
    tl.feed([OperationRecord("fan", "parallel", "fan", "started", ts=11.0, seq=1)],
            [Event("r", "run.started", ts=10.0, seq=1), Event("r", "run.waiting", ts=12.0, seq=2)])
    tl.feed([OperationRecord("fan", "parallel", "fan", "completed", ts=41.0, seq=2)],
            [Event("r", "run.resumed", ts=40.0, seq=3)])
    assert [(i.key, i.outcome, i.t0, i.t1) for i in tl.items.values() if i.src == 0] == [("fan", "ok", 11.0, 41.0)]
