"""`dsb --kube ui` against the real control plane with the operator running (issue 26, acceptance 1, in a
cluster): the list shows the namespace's Workflows as the operator reports them; a loss-injection
Workflow's timeline shows the loss, the restore and the replayed call in order; signalling its callback
from the page (a spec.signals patch) lets the operator complete the run; suspend and resume from the page
set spec.suspend. The caller's kubeconfig is the only credential (KUBECONFIG, set by the fixture)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser_support import (
    Page,
    header_fact,
    screenshots_dir,
    shoot,
    tab,
    timeline_rows,
    ui_servers,
)
from tests.e2e.controlplane import ControlPlane
from tests.e2e.operator_support import (
    get,
    manifest,
    namespace,
    operators,
    sa_kubeconfig,
    status,
    wait_condition,
    wait_event,
    wait_in_flight,
)

__all__ = ["namespace", "operators", "tab", "ui_servers"]  # fixtures

pytestmark = [
    pytest.mark.browser,
    pytest.mark.apiserver_journal("`dsb --kube ui` is started here without the PostgreSQL journal's --store URL "
                                  "(test_cli_kube_postgres.py reads such runs through `dsb --kube --store`)"),
]


def spec(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return dict((get(cp, ns, name) or {}).get("spec") or {})


def test_list_timeline_and_signal_against_the_cluster(
    control_plane: ControlPlane, namespace: str, operators: Any, tab: Page, ui_servers: Any, tmp_path: Path
) -> None:
    operators("--allow-local-provider", "--workflows", "examples.flows")
    lossy = manifest("lossy", injectLossAfterNCalls=3)
    lossy["spec"]["toolCalls"].append({"type": "shell", "command": "cat notes/hello.txt | wc -l"})
    control_plane.apply(lossy, "-n", namespace)
    control_plane.apply(manifest("approve-me", entrypoint="examples.flows.hello_flow:hello",
                                 input={"name": "Ada", "approve": True}, toolCalls=None, sandbox=None,
                                 snapshotEveryNCalls=None), "-n", namespace)  # fmt: skip
    server = ui_servers(("--kube", "-n", namespace), ("--allow-actions",))
    assert f"namespace {namespace}" in server.log.read_text()
    page = tab.page
    page.goto(server.url)
    # The list follows the operator without a reload.
    page.wait_for_selector("tr.run[data-ref='lossy'][data-status='succeeded']", timeout=180_000)
    page.wait_for_selector("tr.run[data-ref='approve-me'][data-status='waiting']", timeout=180_000)
    assert page.locator("tr.run[data-ref='lossy'] td.calls").inner_text() == "5/5"
    uid = control_plane.kubectl_json("get", "workflow", "lossy", "-n", namespace)["metadata"]["uid"]
    assert page.locator("tr.run[data-ref='lossy'] td.id").inner_text() == f"lossy-{uid[:8]}"
    shoot(page, screenshots_dir(tmp_path), "kube-runs")

    page.click("a[href='/run?id=lossy']")
    page.wait_for_selector("#tl-list .tr[data-kind='finalize']")
    rows = timeline_rows(page)
    journal = [(kind, outcome) for kind, outcome, _ in rows if kind in ("call", "snapshot", "loss", "restore")]
    assert journal == [
        ("call", "ok"), ("call", "ok"), ("snapshot", "ok"), ("call", "ok"), ("loss", "warning"), ("restore", "ok"),
        ("call", "replayed"), ("call", "nonzero"), ("snapshot", "ok"), ("call", "ok"),
    ], rows
    calls = [label for kind, outcome, label in rows if kind == "call" and outcome != "replayed"]
    assert [label for _, outcome, label in rows if outcome == "replayed"] == [calls[2]] == ["read_file: notes/hello.txt"]
    assert "Workflow" in page.inner_text(".facts") and namespace in page.inner_text(".facts")
    # The header is the run's summary, as status (kubectl describe) and `dsb --kube inspect` count it.
    assert header_fact(page, "recoveries") == str(status(control_plane, namespace, "lossy")["recoveryCount"]) == "1"
    page.click("#tl-list .tr[data-kind='restore']")
    page.locator("#tl-detail").get_by_text("replayed 1 call into the new sandbox").wait_for()
    shoot(page, screenshots_dir(tmp_path), "kube-run-loss", full=True)

    # Signal the waiting Workflow from its page: a spec.signals patch; the operator finishes the run.
    page.goto(f"{server.base}/run?id=approve-me")
    form = page.locator("form.callback[data-callback='approval']")
    form.locator("textarea").fill('{"approved": true, "by": "the web view"}')
    assert form.locator("input[name=resume]").count() == 0  # the operator continues runs by itself
    form.locator("button[type=submit]").click()
    assert "spec.signals" in page.inner_text(".confirm")
    assert "signals" not in spec(control_plane, namespace, "approve-me")
    shoot(page, screenshots_dir(tmp_path), "kube-confirm-signal")
    page.click("button.confirm-signal")
    assert "spec.signals.approval of Workflow approve-me set" in page.inner_text("#flash")
    assert spec(control_plane, namespace, "approve-me")["signals"] == {"approval": {"approved": True, "by": "the web view"}}
    wait_condition(control_plane, namespace, "approve-me", "Succeeded")
    page.wait_for_selector("#run-status:text('succeeded')", timeout=60_000)
    assert status(control_plane, namespace, "approve-me")["result"]["approval"] == {"approved": True, "by": "the web view"}
    page.wait_for_selector("#tl-list .tr[data-kind='signal']")
    shoot(page, screenshots_dir(tmp_path), "kube-run-signalled", full=True)
    page.goto(f"{server.base}/sandboxes?all=1")
    assert page.locator("td a[href='/run?id=lossy']").count() == 1
    tab.check()


def test_suspend_and_resume_from_the_page_set_spec_suspend(
    control_plane: ControlPlane, namespace: str, operators: Any, tab: Page, ui_servers: Any, tmp_path: Path
) -> None:
    operators("--allow-local-provider")
    gate = tmp_path / "gate"
    calls = [
        {"type": "write_file", "path": "notes/a.txt", "contents": "kept across the suspend\n"},
        {"type": "shell", "command": f"while [ ! -e {gate} ]; do sleep 0.05; done; echo gate passed"},
        {"type": "read_file", "path": "notes/a.txt"},
    ]
    control_plane.apply(manifest("pausable", toolCalls=calls, snapshotEveryNCalls=None), "-n", namespace)
    wait_in_flight(control_plane, namespace, "pausable", 1)
    server = ui_servers(("--kube", "-n", namespace), ("--allow-actions",))
    page = tab.page
    page.goto(f"{server.url}".replace("/runs?", "/run?id=pausable&"))
    page.wait_for_selector("#run-status:text('running')")
    page.click("button.act-suspend")
    assert "spec.suspend: true" in page.inner_text(".confirm")
    page.click("button.confirm-suspend")
    assert spec(control_plane, namespace, "pausable")["suspend"] is True
    gate.touch()  # the call in flight finishes; the operator stops the run at that boundary
    wait_condition(control_plane, namespace, "pausable", "Suspended")
    page.wait_for_selector("#run-status:text('suspended')", timeout=60_000)
    page.wait_for_selector("#tl-list .tr[data-kind='suspend']", timeout=60_000)  # the Workflow's Suspended Event
    # Hibernated: its snapshot is status.latestSnapshot, and the header's live snapshot; the run is not running.
    latest = status(control_plane, namespace, "pausable")["latestSnapshot"]
    assert latest and header_fact(page, "live snapshots") == latest
    assert header_fact(page, "suspended").startswith("since ")
    assert page.locator("button.act-resume").is_enabled()
    shoot(page, screenshots_dir(tmp_path), "kube-run-suspended", full=True)
    page.click("button.act-resume")
    page.click("button.confirm-resume")
    assert spec(control_plane, namespace, "pausable")["suspend"] is False
    wait_condition(control_plane, namespace, "pausable", "Succeeded")
    wait_event(control_plane, namespace, "pausable", "Resumed")
    page.wait_for_selector("#run-status:text('succeeded')", timeout=60_000)
    page.wait_for_selector("#tl-list .tr[data-kind='resume']", timeout=60_000)
    result = status(control_plane, namespace, "pausable")["result"]
    assert json.dumps(result).count("kept across the suspend") == 1
    tab.check()


def test_the_view_has_the_kubeconfig_s_rights_and_no_more(
    control_plane: ControlPlane, namespace: str, operators: Any, tab: Page, ui_servers: Any, tmp_path: Path
) -> None:
    """A viewer (get/list on Workflows, their Journals and Events, nothing else) sees the runs and their
    timelines; with --allow-actions its cancel is refused by the API server, and the page says so."""
    operators("--allow-local-provider", "--workflows", "examples.flows")
    control_plane.apply(manifest("approve-me", entrypoint="examples.flows.hello_flow:hello",
                                 input={"name": "Ada", "approve": True}, toolCalls=None, sandbox=None,
                                 snapshotEveryNCalls=None), "-n", namespace)  # fmt: skip
    wait_condition(control_plane, namespace, "approve-me", "WaitingForSignal")
    control_plane.kubectl("create", "serviceaccount", "viewer", "-n", namespace)
    control_plane.kubectl("create", "role", "run-viewer", "-n", namespace, "--verb=get,list,watch",
                          "--resource=workflows.durable-sandbox.dev,journals.durable-sandbox.dev,"
                          "sandboxes.durable-sandbox.dev,events")
    control_plane.kubectl("create", "rolebinding", "run-viewer", "-n", namespace, "--role=run-viewer",
                          f"--serviceaccount={namespace}:viewer")
    kubeconfig = tmp_path / "viewer.kubeconfig"
    sa_kubeconfig(control_plane, namespace, "viewer", kubeconfig)
    server = ui_servers(("--kube",), ("--allow-actions",), env={"KUBECONFIG": str(kubeconfig)})
    page = tab.page
    page.goto(server.url)
    page.wait_for_selector("tr.run[data-ref='approve-me'][data-status='waiting']")
    page.click("a[href='/run?id=approve-me']")
    page.wait_for_selector("#tl-list .tr[data-kind='callback'][data-outcome='waiting']")
    page.click("button.act-cancel")
    page.click("button.confirm-cancel")
    flash = page.inner_text("#flash.bad")
    assert "the API server refused to patch Workflow" in flash and "(403)" in flash, flash
    assert not spec(control_plane, namespace, "approve-me").get("cancel")
    tab.check()
