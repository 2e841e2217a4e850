"""`dsb ui` over a local store, in a real browser (issue 26, acceptance 1, locally): the runs list shows
the runs `dsb run` made (and one made while the page is open, without a reload); a loss-injection run's
timeline shows the loss, the restore and the replayed call in order; signalling a callback from the page
completes the run. Each page the test checks is photographed (docs/ui.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dsb import dsb
from tests.e2e.browser_support import (
    Page,
    header_fact,
    screenshots_dir,
    shoot,
    tab,
    timeline_rows,
    ui_servers,
)

__all__ = ["tab", "ui_servers"]  # fixtures

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "examples" / "hello-workflow.yaml"


def loss_manifest(path: Path, name: str = "lossy") -> Path:
    """The example manifest with a sandbox loss injected after 3 calls (snapshots every 2)."""
    doc = yaml.safe_load(HELLO.read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["injectLossAfterNCalls"] = 3
    doc["spec"]["toolCalls"].append({"type": "shell", "command": "cat notes/hello.txt | wc -l"})
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


def run_ids(store: Path) -> dict[str, str]:
    out = dsb("--store", str(store), "runs", "-o", "json", process=True)
    assert out.returncode == 0, out.stderr
    return {r["runId"]: r["status"] for r in json.loads(out.stdout)}


def test_the_runs_list_shows_the_runs_dsb_run_made_and_new_ones_live(
    store: Path, tmp_path: Path, tab: Page, ui_servers: Any
) -> None:
    assert dsb("--store", str(store), "run", str(HELLO), process=True).returncode == 0
    assert dsb("--store", str(store), "run", str(loss_manifest(tmp_path / "lossy.yaml")), process=True).returncode == 0
    waiting = dsb("--store", str(store), "run", "examples.flows.hello_flow:hello", "--run-id", "hello-ada",
                  "--input", '{"name": "Ada", "approve": true}', process=True)
    assert waiting.returncode == 3, waiting.stderr
    made = run_ids(store)
    assert sorted(made.values()) == ["succeeded", "succeeded", "waiting"]

    server = ui_servers(("--store", str(store)))
    page = tab.page
    page.goto(server.url)
    page.wait_for_selector("tr.run")
    assert page.url == f"{server.base}/runs"  # the token went into a cookie, out of the address bar
    shown = {r.get_attribute("data-ref"): r.get_attribute("data-status") for r in page.query_selector_all("tr.run")}
    assert shown == made
    row = page.locator("tr.run[data-ref='hello-ada']")
    assert "waiting on approval" in row.inner_text()
    lossy = next(r for r in made if r.startswith("lossy-"))
    assert page.locator(f"tr.run[data-ref='{lossy}'] td.calls").inner_text() == "5/5"
    shoot(page, screenshots_dir(tmp_path), "runs")

    # A run made while the page is open appears without a reload (server-sent events).
    assert dsb("--store", str(store), "run", "examples.flows.hello_flow:hello", "--run-id", "hello-bob",
               "--input", '{"name": "Bob"}', process=True).returncode == 0
    page.wait_for_selector("tr.run[data-ref='hello-bob'][data-status='succeeded']")
    # Filters: status, and the manifest's Workflow name.
    page.goto(f"{server.base}/runs?status=waiting")
    assert [r.get_attribute("data-ref") for r in page.query_selector_all("tr.run")] == ["hello-ada"]
    page.goto(f"{server.base}/runs?workflow=lossy")
    assert [r.get_attribute("data-ref") for r in page.query_selector_all("tr.run")] == [lossy]
    page.goto(f"{server.base}/sandboxes?all=1")
    assert page.locator(f"td a[href='/run?id={lossy}']").count() == 1
    shoot(page, screenshots_dir(tmp_path), "sandboxes")
    tab.check()


def test_the_timeline_of_a_loss_injection_run_shows_loss_restore_and_replayed_calls_in_order(
    store: Path, tmp_path: Path, tab: Page, ui_servers: Any
) -> None:
    assert dsb("--store", str(store), "run", str(loss_manifest(tmp_path / "lossy.yaml")), process=True).returncode == 0
    [run_id] = run_ids(store)
    server = ui_servers(("--store", str(store)))
    page = tab.page
    page.goto(server.url)
    page.click(f"a[href='/run?id={run_id}']")
    page.wait_for_selector("#tl-list .tr[data-kind='finalize']")
    rows = timeline_rows(page)
    journal = [(kind, outcome) for kind, outcome, _ in rows if kind not in ("run", "lost")]
    assert journal == [
        ("provision", "ok"), ("call", "ok"), ("call", "ok"), ("snapshot", "ok"), ("call", "ok"),
        ("loss", "warning"), ("destroy", "warning"), ("restore", "ok"), ("call", "replayed"),
        ("call", "nonzero"), ("snapshot", "ok"), ("snapshot-delete", "ok"), ("call", "ok"), ("destroy", "ok"),
        ("snapshot-delete", "ok"), ("finalize", "ok"),
    ], rows
    kinds = [kind for kind, _, _ in rows]
    # The session's own notice of the loss (why it was lost) sits between the loss and the restore.
    assert kinds.index("loss") < kinds.index("lost") < kinds.index("restore")
    calls = [label for kind, outcome, label in rows if kind == "call" and outcome != "replayed"]
    assert calls[2] == "read_file: notes/hello.txt"
    assert [label for _, outcome, label in rows if outcome == "replayed"] == [calls[2]]
    assert any(label.startswith("recovery from lsnap-") for _, _, label in rows)
    # The header agrees with the timeline and `dsb inspect` (one summary: sandboxes/summary.py).
    inspected = json.loads(dsb("--store", str(store), "inspect", run_id, "-o", "json", process=True).stdout)
    assert header_fact(page, "recoveries") == str(inspected["recoveryCount"]) == "1"
    assert header_fact(page, "live snapshots") == (", ".join(inspected["snapshots"]) or "none")

    # The restore's record: where it came from and what it replayed; then the replayed call's, which is the
    # original call's record (same op id, outcome checked).
    page.click("#tl-list .tr[data-kind='restore']")
    detail = page.locator("#tl-detail")
    detail.get_by_text("replayed 1 call into the new sandbox").wait_for()
    assert '"reason": "recovery"' in detail.inner_text()
    shoot(page, screenshots_dir(tmp_path), "run-loss", full=True)
    page.click("#tl-list .tr[data-outcome='replayed']")
    detail.get_by_text("Replays the call recorded as").wait_for()
    assert "exit code" in detail.inner_text()
    page.click("#tl-detail a[data-goto]")
    page.wait_for_selector("#tl-list .tr.sel[data-kind='call'][data-outcome='ok']")
    # Filtering by kind hides the others; the overview and the list agree on the count.
    page.click("#tl-kinds button[data-kind='call']")
    assert "call" not in {k for k, _, _ in timeline_rows(page)}
    tab.check()


def test_signalling_a_callback_from_the_page_completes_the_run(
    store: Path, tmp_path: Path, tab: Page, ui_servers: Any
) -> None:
    waiting = dsb("--store", str(store), "run", "examples.flows.hello_flow:hello", "--run-id", "hello-ada",
                  "--input", '{"name": "Ada", "approve": true}', process=True)
    assert waiting.returncode == 3, waiting.stderr
    server = ui_servers(("--store", str(store)), ("--allow-actions",))
    page = tab.page
    page.goto(server.url)
    page.click("a[href='/run?id=hello-ada']")
    form = page.locator("form.callback[data-callback='approval']")
    assert "Send 'Hello, Ada!'?" in form.inner_text()
    form.locator("textarea").fill('{"approved": true, "by": "the web view"}')
    # A live update of the header (as the stream sends one whenever the run changes) keeps what was typed.
    page.evaluate("window.dsbTimeline.apply({header: document.getElementById('run-header').innerHTML})")
    assert form.locator("textarea").input_value() == '{"approved": true, "by": "the web view"}'
    shoot(page, screenshots_dir(tmp_path), "run-waiting", full=True)
    form.locator("button[type=submit]").click()
    # The confirmation says what will happen; nothing has happened yet.
    page.wait_for_selector("button.confirm-signal")
    assert f"dsb --store {store} resume hello-ada" in page.inner_text(".confirm")
    assert run_ids(store) == {"hello-ada": "waiting"}
    shoot(page, screenshots_dir(tmp_path), "confirm-signal")
    page.click("button.confirm-signal")
    assert "signalled approval of run hello-ada" in page.inner_text("#flash")
    # The background `dsb resume` finishes the run; the page learns it from the stream, without a reload.
    page.wait_for_selector("#run-status:text('succeeded')", timeout=120_000)
    page.wait_for_selector("#tl-list .tr[data-kind='signal']")
    state = json.loads(dsb("--store", str(store), "inspect", "hello-ada", "-o", "json", process=True).stdout)
    assert state["status"] == "succeeded"
    assert state["result"]["approval"] == {"approved": True, "by": "the web view"}
    assert page.locator("#tl-list .tr[data-kind='callback']").get_attribute("data-outcome") == "ok"
    shoot(page, screenshots_dir(tmp_path), "run-signalled", full=True)
    tab.check()


def test_a_read_only_view_offers_no_action_and_refuses_one(store: Path, tab: Page, ui_servers: Any) -> None:
    assert dsb("--store", str(store), "run", "examples.flows.hello_flow:hello", "--run-id", "hello-ada",
               "--input", '{"name": "Ada", "approve": true}', process=True).returncode == 3
    server = ui_servers(("--store", str(store)))
    page = tab.page
    page.goto(server.url)
    page.click("a[href='/run?id=hello-ada']")
    page.wait_for_selector(".callbacks")
    assert page.locator("form").count() == 0
    assert "dsb signal hello-ada approval VALUE_JSON" in page.inner_text(".callbacks")
    # A POST made anyway (as a script could) is refused.
    status = page.evaluate("""async () => (await fetch('/action/cancel', {method: 'POST',
        body: new URLSearchParams({id: 'hello-ada', confirmed: 'yes'})})).status""")
    assert status == 403
    tab.errors.clear()  # the refused POST is the point here
    assert run_ids(store) == {"hello-ada": "waiting"}


def test_a_postgresql_store_works_alike_and_its_password_never_shows(
    postgres_server: Any, postgres_dsn: str, tmp_path: Path, tab: Page, ui_servers: Any
) -> None:
    """`dsb --store postgresql://... ui`: the same pages; the URL's password is on no page and in no command line
    (the background resume gets the store in its environment, as `dsb run --detach` does)."""
    password = postgres_server.password
    env = {"DURABLE_SANDBOX_HOME": str(tmp_path / "home")}
    waiting = dsb("--store", postgres_dsn, "run", "examples.flows.hello_flow:hello", "--run-id", "hello-pg",
                  "--input", '{"name": "Ada", "approve": true}', env=env, process=True)
    assert waiting.returncode == 3, waiting.stderr
    server = ui_servers(("--store", postgres_dsn), ("--allow-actions",), env=env)
    assert password not in server.log.read_text()
    page = tab.page
    page.goto(server.url)
    page.click("a[href='/run?id=hello-pg']")
    form = page.locator("form.callback[data-callback='approval']")
    form.locator("textarea").fill('{"approved": true}')
    form.locator("button[type=submit]").click()
    assert password not in page.content()
    page.click("button.confirm-signal")
    page.wait_for_selector("#run-status:text('succeeded')", timeout=120_000)
    for html in (page.content(), page.goto(f"{server.base}/runs").text(), page.content()):
        assert password not in html
    state = json.loads(dsb("--store", postgres_dsn, "inspect", "hello-pg", "-o", "json", env=env, process=True).stdout)
    assert (state["status"], state["result"]["approval"]) == ("succeeded", {"approved": True})
    tab.check()


def test_a_run_deleted_while_its_page_is_open_is_said_to_be_gone(store: Path, tab: Page, ui_servers: Any) -> None:
    assert dsb("--store", str(store), "run", "examples.flows.hello_flow:hello", "--run-id", "short-lived",
               "--input", '{"name": "Bob"}', process=True).returncode == 0
    server = ui_servers(("--store", str(store)))
    page = tab.page
    page.goto(server.url.replace("/runs?", "/run?id=short-lived&"))
    page.wait_for_selector("#tl-list .tr[data-kind='run'][data-outcome='ok']")
    assert dsb("--store", str(store), "delete", "short-lived", process=True).returncode == 0
    page.wait_for_selector("#tl-notice:text('This run no longer exists')")
    assert "short-lived" in page.inner_text("#tl-notice")
    tab.check()
