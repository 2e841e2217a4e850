"""Smoke test for benchmarks/: the modules import and each part runs at a tiny size, so they do not rot.

Only correctness is checked here (every run succeeds, replay re-executes nothing); the figures are
meaningless at these sizes. The LangGraph and DBOS parts are skipped when the ``bench`` extra is absent.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    return importlib.import_module(name)


def test_engine_steps_engine_part(tmp_path: Path) -> None:
    mod = _load("engine_steps")
    out = tmp_path / "steps.json"
    res = mod.main(
        ["--steps", "20", "--replay-steps", "10", "--repeats", "1", "--slow-repeats", "1", "--warmup", "1",
         "--no-langgraph", "--no-dbos", "--tmp", str(tmp_path), "--out", str(out)]
    )
    assert res["engine"]["steps_per_s"] > 0
    assert res["engine_sync"]["steps_per_s"] > 0 and res["engine_sync"]["step_function"] == "sync"
    assert res["engine_fsync"]["steps_per_s"] > 0
    assert res["engine_replay"]["replay_ms"] > 0  # the crashed child's run was resumed with no step re-run
    assert json.loads(out.read_text())["engine"]["steps"] == 20


def test_engine_parallel_engine_part(tmp_path: Path) -> None:
    mod = _load("engine_parallel")
    out = tmp_path / "parallel.json"
    res = mod.main(
        ["--fanout", "12", "--callbacks", "3", "--sizes", "5,10", "--repeats", "1", "--warmup", "0",
         "--no-langgraph", "--tmp", str(tmp_path), "--out", str(out)]
    )
    assert res["engine"]["fanout"]["compacted_bytes"] > 0
    assert res["engine"]["callbacks"]["seconds"]["median"] > 0
    assert set(res["engine_growth"]) == {"5", "10"}
    assert out.exists()


def test_langgraph_parts(tmp_path: Path) -> None:
    pytest.importorskip("langgraph.func")
    pytest.importorskip("langgraph.checkpoint.sqlite")
    steps = _load("engine_steps")
    par = _load("engine_parallel")
    base = str(tmp_path)
    assert steps.lg_throughput_once(5, is_async=False, durability="sync", base=base) > 0
    assert steps.lg_throughput_once(5, is_async=True, durability="sync", base=base) > 0
    assert steps.lg_replay_once(5, is_async=False, base=base) > 0
    assert steps.lg_replay_once(5, is_async=True, base=base) > 0
    for kind in ("fanout", "callbacks", "sequential"):
        dt, live, compacted = par._lg_flow(kind, 4, base, False)
        assert dt > 0 and live > 0 and compacted > 0


def test_sync_steps_interleaved(tmp_path: Path) -> None:
    pytest.importorskip("langgraph.func")
    pytest.importorskip("langgraph.checkpoint.sqlite")
    out = tmp_path / "sync.json"
    res = _load("sync_steps").main(["--steps", "5", "--rounds", "1", "--tmp", str(tmp_path), "--out", str(out)])
    assert set(res["ratios"]) == {"async_vs_langgraph_fastest", "sync_vs_langgraph_fastest", "sync_vs_async"}
    assert all(len(s) == 1 for s in res["samples_seconds"].values()) and out.exists()


def test_dbos_part(tmp_path: Path) -> None:
    pytest.importorskip("dbos")
    steps = _load("engine_steps")
    res = steps.bench_dbos_variant(5, 1, 0, wal=True, base=str(tmp_path))
    assert res["steps_per_s"] > 0


async def test_kubernetes_provider_store_part(s3_server: object) -> None:
    from durable_sandbox.providers.s3_snapshots import S3SnapshotStore

    mod = _load("kubernetes_provider")
    store = S3SnapshotStore(s3_server.config("bench-smoke"))  # type: ignore[attr-defined]
    try:
        await store.ensure_bucket()
        res = await mod.store_part(store, [mod.MB])
    finally:
        await store.aclose()
    assert res["1MB"]["put_MBps"] > 0 and res["1MB"]["get_MBps"] > 0 and res["1MB"]["get_heap_peak_MB"] < 5


def test_ui_pages_http_part(tmp_path: Path) -> None:
    mod = _load("ui_pages")
    out = tmp_path / "ui.json"
    res = mod.main(["--runs", "12", "--calls", "30", "--small-calls", "6", "--repeats", "1", "--no-browser",
                    "--tmp", str(tmp_path), "--out", str(out)])
    assert res["http_runs_page_s"]["median"] > 0 and res["baseline_dsb_runs_s"]["median"] > 0
    assert res["http_timeline_big"]["bytes"] > res["http_timeline_small"]["bytes"] > 0
    assert json.loads(out.read_text())["runs"] == 12


def test_tracing_cost_runs(tmp_path: Path) -> None:
    mod = _load("tracing_cost")
    res = mod.main(["--steps", "10", "--repeats", "1", "--warmup", "0", "--tmp", str(tmp_path),
                    "--out", str(tmp_path / "tracing.json")])
    assert all(res[v]["steps_per_s"] > 0 for v in ("baseline", "off", "on"))


def test_session_recovery_against_a_tree(tmp_path: Path) -> None:
    bench = _load("session_recovery")
    out = tmp_path / "session.json"
    # This tree against itself: every workload runs in its children (recovery included) and the ratio is formed.
    res = bench.main(["--calls", "3", "--snapshot-every", "2", "--rounds", "1", "--against", str(bench.THIS_TREE),
                      "--tmp", str(tmp_path), "--out", str(out)])
    assert set(res["ratios_this_over_baseline"]) == {"calls", "recovery"}
    assert all(len(s) == 1 for per in res["samples_seconds"].values() for s in per.values()) and out.exists()


def test_child_workflows(tmp_path: Path) -> None:
    out = tmp_path / "children.json"
    res = _load("child_workflows").main(["--children", "3", "--rounds", "1", "--tmp", str(tmp_path), "--out", str(out)])
    assert res["ratios"]["child_vs_step"] > 0 and out.exists()


def test_continue_as_new(tmp_path: Path) -> None:
    out = tmp_path / "can.json"
    res = _load("continue_as_new").main(["--calls", "5", "6", "--rounds", "1", "--tmp", str(tmp_path),
                                         "--out", str(out)])
    assert set(res["median_seconds"]) == {"5", "6"} and out.exists()
    assert set(res["median_seconds"]["5"]["inline"]["cpu"]) == {"call", "handover", "ending_state", "handover_proper"}
    assert set(res["ratios"]["6"]["now"]) == {"wall", "cpu", "thread_cpu"}


def test_fork_benchmark(tmp_path: Path) -> None:
    mod = _load("fork")
    out = tmp_path / "fork.json"
    res = mod.main(["--calls", "6", "--after", "5", "--every", "2", "--mb", "1", "--repeats", "1",
                    "--tmp", str(tmp_path), "--out", str(out)])
    assert res["seconds"]["fork"] > 0 and res["seconds"]["replay"] > 0 and res["seconds"]["ten_forks"] > 0
    assert json.loads(out.read_text())["args"]["after"] == "5"


def test_worker_throughput_engine_part(tmp_path: Path) -> None:
    mod = _load("worker_throughput")
    out = tmp_path / "worker.json"
    res = mod.main(["--steps", "5", "--runs", "2", "--repeats", "1", "--no-cli", "--tmp", str(tmp_path),
                    "--out", str(out)])
    assert res["engine"]["worker"]["steps_per_s"] > 0 and res["engine"]["run"]["steps_per_s"] > 0
    assert res["engine"]["worker_build"]["steps_per_s"] > 0
    assert json.loads(out.read_text())["engine"]["ratio_worker_over_run"] > 0


async def test_session_call_phases_parts() -> None:
    """The phase timer's wrappers time into the call under way only (nothing outside a call), the Nth commit gets
    its own name, and the summary splits what the client waited for into the operator's part and the wire's."""
    timer, phases = _load("session_phase_timer"), _load("session_call_phases")

    class Store:
        async def commit(self) -> str:
            return "done"

    timer._timed(Store, "commit", timer._nth("commit"))
    assert await Store().commit() == "done"  # outside a call: not timed, nowhere to put it
    call: dict[str, float] = {}
    token = timer._CALL.set(call)
    try:
        await Store().commit()
        await Store().commit()
    finally:
        timer._CALL.reset(token)
    assert sorted(call) == ["commit_1", "commit_2"] and all(v >= 0 for v in call.values())
    rows = phases.per_call([0.010], [{"total": 0.006, "commit_1": 0.002, "commit_2": 0.001, "patch_1": 0.0015}])
    assert rows[0]["http"] == pytest.approx(0.004) and rows[0]["other"] == pytest.approx(0.003)
    table = phases.summary(rows)
    assert list(table)[:3] == ["client", "http", "total"] and table["client"]["mean_ms"] == pytest.approx(10.0)
