"""The web view's HTTP surface over a real store (ui/app.py, ui/security.py, ui/local.py): who gets in,
what the pages show, and that an action does only what it says, only when allowed and confirmed."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import durable_sandbox
from durable_sandbox.runs.errors import CliError
from durable_sandbox.runs.session import Settings
from durable_sandbox.stores import SqliteStore
from durable_sandbox.ui.app import create_app
from durable_sandbox.ui.local import LocalSource
from durable_sandbox.ui.security import Guard
from durable_sandbox.ui.server import check_token
from tests.dsb import dsb
from tests.unit import ui_flows

PORT = 41234
TOKEN = "test-token-0123456789"
BASE = f"http://127.0.0.1:{PORT}"


@pytest.fixture
async def engine(db_path: Path) -> AsyncIterator[durable_sandbox.Engine]:
    store = SqliteStore(db_path)
    e = durable_sandbox.Engine(store, worker_id="ui-test")
    ui_flows.ATTEMPTS.clear()
    assert (await e.run(ui_flows.everything, {"key": "a"}, run_id="ui-a", labels={"team": "infra"})).status == "waiting"
    await e.create(ui_flows.everything, {"key": "b"}, run_id="ui-b", labels={"team": "web"})
    yield e
    await e.aclose()
    await store.close()


def client_for(engine: durable_sandbox.Engine, db_path: Path, *, allow_actions: bool = False) -> httpx.AsyncClient:
    settings = Settings(store=str(db_path), store_given=True)
    app = create_app(LocalSource(engine, settings), Guard("127.0.0.1", PORT, TOKEN, allow_actions=allow_actions))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE,
                             headers={"authorization": f"Bearer {TOKEN}"})


async def test_every_page_needs_the_token_and_the_url_with_it_sets_a_cookie(engine: durable_sandbox.Engine, db_path: Path) -> None:
    async with client_for(engine, db_path) as c:
        bare = httpx.AsyncClient(transport=c._transport, base_url=BASE)
        assert (await bare.get("/runs")).status_code == 401
        assert (await bare.get("/runs", headers={"authorization": "Bearer wrong-token-000000"})).status_code == 401
        assert (await bare.get("/runs?token=nope")).status_code == 401
        assert (await bare.get("/healthz")).status_code == 200
        got = await bare.get(f"/runs?status=waiting&token={TOKEN}")
        assert got.status_code == 303 and got.headers["location"] == "/runs?status=waiting"
        assert f"dsb_ui_{PORT}={TOKEN}" in got.headers["set-cookie"] and "HttpOnly" in got.headers["set-cookie"]
        assert "SameSite=Strict" in got.headers["set-cookie"]
        with_cookie = httpx.AsyncClient(transport=c._transport, base_url=BASE, cookies={f"dsb_ui_{PORT}": TOKEN})
        assert (await with_cookie.get("/runs")).status_code == 200
        # Another address for the same port (DNS rebinding) is refused even with the token.
        assert (await c.get("/runs", headers={"host": f"evil.example:{PORT}"})).status_code == 421
        page = await c.get("/runs")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp


async def test_the_runs_list_filters_pages_and_shows_calls(engine: durable_sandbox.Engine, db_path: Path) -> None:
    async with client_for(engine, db_path) as c:
        page = (await c.get("/runs")).text
        rows = re.findall(r'<tr class="run st-(\w+)" data-ref="([^"]+)"', page)
        assert rows == [("pending", "ui-b"), ("waiting", "ui-a")]  # newest first
        assert "waiting on approve" in page
        assert 'class="num calls">4/4<' in page  # a code workflow's total: the sandbox calls it reached (as status.calls)
        assert re.findall(r'data-ref="([^"]+)"', (await c.get("/runs?status=waiting")).text) == ["ui-a"]
        assert re.findall(r'data-ref="([^"]+)"', (await c.get("/runs?label=team%3Dweb")).text) == ["ui-b"]
        assert re.findall(r'data-ref="([^"]+)"', (await c.get("/runs?label=team")).text) == ["ui-b", "ui-a"]
        assert re.findall(r'data-ref="([^"]+)"', (await c.get("/runs?workflow=ui-everything&per=20&page=1")).text) == ["ui-b", "ui-a"]
        assert "No runs here that match" in (await c.get("/runs?workflow=other")).text
        second = (await c.get("/runs?per=20&page=2")).text
        assert "data-ref=" not in second and "page 2 of" in second


async def test_the_run_page_and_its_records_show_no_secret(engine: durable_sandbox.Engine, db_path: Path) -> None:
    async with client_for(engine, db_path) as c:
        page = (await c.get("/run?id=ui-a")).text
        assert "ui-a" in page and "Waiting for 1 signal" in page and "ship it?" in page
        assert "do-not-show" not in page  # the callback payload's env value
        assert "/action/signal" not in page  # read-only: no action forms at all
        tl = (await c.get("/api/timeline?id=ui-a")).json()
        kinds = [i["c"] for i in tl["items"]]
        assert kinds.count("call") == 5 and "loss" in kinds and "restore" in kinds  # 4 calls + 1 replayed
        [secret] = [i for i in tl["items"] if i["k"] == "secret"]
        record = (await c.get(f"/api/record?id=ui-a&key={secret['k']}")).text
        assert "sk-live-do-not-show" not in record and "pw@" not in record and "abc" not in record
        assert '\\"inputTokens\\": 12' in record
        assert (await c.get("/run?id=nope")).status_code == 404
        assert (await c.get("/api/record?id=ui-a&key=nope")).status_code == 404
        assert "no such" not in (await c.get("/sandboxes?all=1")).text
        assert "finalized" in (await c.get("/sandboxes?all=1")).text
        sandboxes = (await c.get("/sandboxes")).text
        assert "(no provider is asked). 1 finished one hidden: " in sandboxes, sandboxes


async def test_actions_need_allow_actions_the_csrf_token_and_a_confirmation(engine: durable_sandbox.Engine, db_path: Path) -> None:
    form = {"id": "ui-a", "callback": "approve", "value": '{"ok": true}'}
    async with client_for(engine, db_path) as c:
        refused = await c.post("/action/signal", data=form)
        assert refused.status_code == 403 and "--allow-actions" in refused.text
    async with client_for(engine, db_path, allow_actions=True) as c:
        page = (await c.get("/run?id=ui-a")).text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        assert (await c.post("/action/signal", data=form)).status_code == 403  # no CSRF token
        assert (await c.post("/action/signal", data={**form, "csrf": "forged"})).status_code == 403
        other_site = await c.post("/action/signal", data={**form, "csrf": csrf[1]}, headers={"origin": "http://evil.example"})
        assert other_site.status_code == 403
        # Without confirmed=yes: a page that says exactly what will happen, and nothing happens.
        ask = await c.post("/action/signal", data={**form, "csrf": csrf[1]}, headers={"origin": BASE})
        assert ask.status_code == 200 and "Confirm: Signal" in ask.text and "signal ui-a CALLBACK VALUE" in ask.text
        assert await engine.store.get_signals("ui-a") == {}
        bad = await c.post("/action/signal", data={**form, "value": "{nope", "csrf": csrf[1], "confirmed": "yes"})
        assert bad.status_code == 400 and "not JSON" in bad.text
        done = await c.post("/action/signal", data={**form, "csrf": csrf[1], "confirmed": "yes"})
        assert done.status_code == 303 and done.headers["location"].startswith("/run?id=ui-a&flash=")
        assert await engine.store.get_signals("ui-a") == {"approve": {"ok": True}}
        shown = (await c.get(done.headers["location"])).text
        assert "signalled approve of run ui-a" in shown
        # Suspend does not exist locally; cancel does what `dsb cancel` does.
        assert (await c.post("/action/suspend", data={"id": "ui-b", "csrf": csrf[1], "confirmed": "yes"})).status_code == 409
        cancelled = await c.post("/action/cancel", data={"id": "ui-b", "csrf": csrf[1], "confirmed": "yes", "reason": "no"})
        assert cancelled.status_code == 303
        assert (await engine.inspect("ui-b")).status == "cancelled"
        again = await c.post("/action/cancel", data={"id": "ui-b", "csrf": csrf[1], "confirmed": "yes"})
        assert again.status_code == 409 and "the run has finished" in again.text


def test_a_token_is_required_off_loopback_and_made_on_it() -> None:
    with pytest.raises(CliError, match="not a loopback address"):
        check_token("0.0.0.0", None)
    with pytest.raises(CliError, match="16 or more"):
        check_token("0.0.0.0", "short")
    assert check_token("0.0.0.0", "a-long-enough-token") == "a-long-enough-token"
    made = check_token("127.0.0.1", None)
    assert len(made) >= 32 and made != check_token("127.0.0.1", None)


def header_fact(page: str, name: str) -> str:
    found = re.search(rf"<dt>{name}</dt><dd>(.*?)</dd>", page, re.S)
    assert found is not None, f"no {name!r} in the run page's header"
    return found[1]


async def test_the_header_counts_recoveries_and_live_snapshots_as_dsb_inspect_does(
    engine: durable_sandbox.Engine, db_path: Path
) -> None:
    """One summary (sandboxes/summary.py) for the page's header and `dsb inspect`: a run that lost its sandbox,
    recovered it, and waits with its newest snapshot live."""
    state = await engine.run(ui_flows.held, {}, run_id="ui-held")
    assert state.status == "waiting", state.error
    inspected = await engine.inspect("ui-held")  # what `dsb inspect` shows
    assert inspected.recovery_count == 1 and len(inspected.snapshots) == 1
    async with client_for(engine, db_path) as c:
        page = (await c.get("/run?id=ui-held")).text
    assert header_fact(page, "recoveries") == "1"
    assert header_fact(page, "live snapshots") == ", ".join(inspected.snapshots)
    assert header_fact(page, "calls") == "4 of 4"  # a code workflow's total: the calls it reached (as status.calls)


async def test_an_interrupted_call_shows_each_attempt_and_a_stopped_run_as_stopped(db_path: Path, home: Path) -> None:
    """Ctrl-C (the fault point's SIGINT) while the second call runs: the page says the run stopped (not "running
    for"), the call's bar ends at the interruption; resumed, the call's second run is an item of its own."""
    interrupted = dsb("run", "tests.unit.ui_flows:cut", "--input", "{}", "--run-id", "ui-cut", store=db_path,
                      home=home, fault="before:ws/second!SIGINT")
    assert interrupted.returncode == 130, interrupted.output
    store = SqliteStore(db_path)
    engine = durable_sandbox.Engine(store, worker_id="ui-test")
    try:
        async with client_for(engine, db_path) as c:
            page = (await c.get("/run?id=ui-cut")).text
            assert "running for" not in page and header_fact(page, "stopped").startswith("since ")
            tl = (await c.get("/api/timeline?id=ui-cut")).json()
            assert tl["live"] is False and tl["terminal"] is False
            [stop] = [i for i in tl["items"] if i["l"].startswith("run interrupted")]
            [cut] = [i for i in tl["items"] if i.get("op", i["k"]) == "ws/second"]
            assert (cut["o"], cut["t1"]) == ("interrupted", stop["t0"])  # the bar ends at the interruption
            resumed = dsb("resume", "ui-cut", store=db_path, home=home, process=True)
            assert resumed.returncode == 0, resumed.output
            tl = (await c.get("/api/timeline?id=ui-cut")).json()
            page = (await c.get("/run?id=ui-cut")).text
        runs = [i for i in tl["items"] if i.get("op", i["k"]) == "ws/second"]
        assert [(i["k"], i["o"], i.get("ra")) for i in runs] == [("ws/second", "interrupted", None),
                                                                  ("ws/second#2", "ok", 1)]
        assert runs[0]["t1"] <= runs[1]["t0"] and "interrupted at +" in runs[1]["note"]
        assert header_fact(page, "took") and tl["terminal"] is True
    finally:
        await engine.aclose()
        await store.close()


async def test_the_run_page_links_to_its_trace_when_a_trace_ui_is_configured(
        engine: durable_sandbox.Engine, db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from durable_sandbox.tracing import TRACEPARENT_LABEL

    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await engine.create(ui_flows.everything, {"key": "c"}, run_id="ui-c", labels={TRACEPARENT_LABEL: caller})
    async with client_for(engine, db_path) as c:
        assert "open the run's trace" not in (await c.get("/run?id=ui-c")).text, "no trace UI configured: no link"
        monkeypatch.setenv("DURABLE_SANDBOX_TRACE_UI", "https://jaeger.example/trace/{trace_id}")
        page = (await c.get("/run?id=ui-c")).text
        assert 'href="https://jaeger.example/trace/4bf92f3577b34da6a3ce929d0e0e4736"' in page
        assert "open the run's trace" not in (await c.get("/run?id=ui-a")).text, "a run without a trace: no link"


async def test_a_parent_links_to_its_children_and_a_child_to_its_parent(
        engine: durable_sandbox.Engine, db_path: Path, tmp_path: Path) -> None:
    from durable_sandbox.engine.children import child_run_id
    from tests.unit.composition_flows import start_then_join

    state = await engine.run(start_then_join, {"log": str(tmp_path / "log"), "n": 2}, run_id="ui-parent")
    assert state.status == "succeeded"
    kids = [child_run_id("ui-parent", f"pkg-{i}") for i in range(2)]
    async with client_for(engine, db_path) as c:
        page = (await c.get("/run?id=ui-parent")).text
        for kid in kids:
            assert f'data-link="child" href="/run?id={kid}"' in page
        child = (await c.get(f"/run?id={kids[0]}")).text
        assert 'data-link="parent" href="/run?id=ui-parent"' in child
        assert 'data-link="child"' not in child
        assert 'data-link=' not in (await c.get("/run?id=ui-b")).text, "a run of its own links to nothing"
