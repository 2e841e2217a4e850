"""One summary of a run for `dsb inspect`, the web view's header and the Workflow's status (sandboxes/summary.py,
journal.Tally): the same journal gives the same recoveries, live snapshots and calls in all three."""

from __future__ import annotations

from durable_sandbox import Engine
from durable_sandbox.kube.reporting.status import Extra, Projection, render
from durable_sandbox.sandboxes.summary import summarize
from durable_sandbox.stores import SqliteStore
from tests.unit import ui_flows


async def test_inspect_the_page_and_status_agree_on_a_recovered_run(store: SqliteStore) -> None:
    engine = Engine(store, worker_id="summary-test")
    try:
        assert (await engine.run(ui_flows.held, {}, run_id="held")).status == "waiting"
        inspected = await engine.inspect("held")  # `dsb inspect`
    finally:
        await engine.aclose()
    run = await store.get_run("held")
    assert run is not None
    rows = await store.load_journal("held")
    page = summarize(run, rows)  # the run page's header
    projection = Projection()
    projection.feed(rows)
    status = render(run, projection, Extra(), run_id="held")  # the Workflow's status
    assert inspected.recovery_count == page.state.recovery_count == status["recoveryCount"] == 1
    assert inspected.snapshots == page.state.snapshots and len(page.state.snapshots) == 1
    assert status["latestSnapshot"] == page.state.snapshots[-1]
    assert status["calls"] == {"completed": page.calls_done, "total": page.calls_total} == {"completed": 4, "total": 4}
