"""The web view at scale: the runs list of 2,000 runs, and the run page of a 10,000-call run.

    python benchmarks/ui_pages.py        # ~10 min on 2 cores (making the 10,000-call run is most of it)

1. **Runs list.** A store with ``--runs`` runs (one step each, a tenth left waiting on a callback, labelled)
   is served by a real ``dsb ui``. Timed: the ``/runs`` page in headless Chromium (navigation start to the
   load event, the table rendered; the first load, which folds every listed run's journal once, and then the
   median of ``--repeats``), the same page over HTTP alone, and the baseline measured in the same run:
   ``dsb --store S runs --limit N -o json`` for the same store (a whole process, as a user runs it), and the
   engine's own ``runs(limit=N)`` call in-process.
2. **Run page.** A run of ``--calls`` sandbox calls (the local provider; a snapshot every 500 calls and a loss
   injected halfway, so the journal has every kind of record) and, as its baseline, a run of 200 calls made
   the same way. Timed for each: from navigation to the whole timeline loaded (the page's count says every
   item is there), the ``/api/timeline`` answer over HTTP (and its size), and scrolling the timeline one
   animation frame at a time for ``--scroll-steps`` frames, 120 px a frame ("wheel"), and from top to bottom
   ("jump"): the frame times (median, p95, max, frames over 50 ms) and the rows in the DOM (the list is
   virtualized: it should not grow with the run).

``--no-browser`` measures the HTTP parts only (the smoke test runs it that way at a tiny size).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx

import durable_sandbox
from _common import RESULTS_DIR, fmt, machine_info, print_table, ratio, run_in_workdir, summarize
from durable_sandbox.stores import SqliteStore

ROOT = Path(__file__).resolve().parents[1]
DSB = str(Path(sys.executable).parent / "dsb")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
URL_LINE = re.compile(r"^dsb ui: (http://\S+)/runs\?token=(\S+)$", re.M)


@durable_sandbox.workflow(name="bench-ui-one-step")
async def one_step(ctx: durable_sandbox.Context, data: dict[str, Any]) -> int:
    value = await ctx.step("only", lambda: int(data["i"]) * 2)
    if data.get("wait"):
        await ctx.callback("approve", {"i": data["i"]})
    return value


@durable_sandbox.workflow(name="bench-ui-calls")
async def many_calls(ctx: durable_sandbox.Context, n: int) -> int:
    async with ctx.sandbox("sandbox", provider="local", snapshot_every=500 if n >= 1000 else 5,
                           inject_loss_after=max(n // 2, 1)) as sbx:
        for i in range(n):
            if i % 100 == 99:
                await sbx.shell(f"echo call {i}")  # a real process now and then
            else:
                await sbx.write_file(f"out/{i % 50}.txt", f"call {i}\n")
    return n


async def make_runs(store_path: Path, runs: int) -> None:
    store = SqliteStore(store_path)
    engine = durable_sandbox.Engine(store)
    try:
        for i in range(runs):
            data = {"i": i, "wait": i % 10 == 0}
            await engine.run(one_step, data, run_id=f"list-{i:05d}", labels={"team": ("infra", "web")[i % 2]})
    finally:
        await engine.aclose()
        await store.close()


async def make_call_runs(store_path: Path, calls: int, small: int) -> dict[str, float]:
    store = SqliteStore(store_path)
    engine = durable_sandbox.Engine(store)
    took: dict[str, float] = {}
    try:
        for run_id, n in (("small", small), ("big", calls)):
            started = time.perf_counter()
            state = await engine.run(many_calls, n, run_id=run_id)
            assert state.status == "succeeded", state.error
            took[run_id] = time.perf_counter() - started
    finally:
        await engine.aclose()
        await store.close()
    return took


async def engine_runs_seconds(store_path: Path, limit: int, repeats: int) -> dict[str, Any]:
    store = SqliteStore(store_path)
    engine = durable_sandbox.Engine(store)
    samples = []
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            got = await engine.runs(limit=limit)
            samples.append(time.perf_counter() - started)
            assert len(got) == limit
    finally:
        await engine.aclose()
        await store.close()
    return summarize(samples)


def dsb_runs_seconds(store_path: Path, limit: int, repeats: int) -> dict[str, Any]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        out = subprocess.run([DSB, "--store", str(store_path), "runs", "--limit", str(limit), "-o", "json"],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        samples.append(time.perf_counter() - started)
        assert out.stdout.count('"runId"') == limit
    return summarize(samples)


class Ui:
    """A real `dsb --store S ui`, as users start it."""

    def __init__(self, store_path: Path, workdir: Path) -> None:
        self.log = workdir / f"ui-{store_path.stem}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([DSB, "--store", str(store_path), "ui"], stdout=out, stderr=subprocess.STDOUT,
                                         text=True, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 120
        while not (found := URL_LINE.search(self.log.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dsb ui did not start:\n{self.log.read_text()}")
            time.sleep(0.1)
        self.base, self.token = found[1], found[2]
        self.http = httpx.Client(base_url=self.base, headers={"authorization": f"Bearer {self.token}"}, timeout=300)

    def timed_get(self, path: str) -> tuple[float, int]:
        started = time.perf_counter()
        resp = self.http.get(path, headers={"accept-encoding": "identity"})
        took = time.perf_counter() - started
        resp.raise_for_status()
        return took, len(resp.content)

    def close(self) -> None:
        self.http.close()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def chromium() -> str:
    out = subprocess.run([str(ROOT / "scripts" / "browser")], stdout=subprocess.PIPE, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


NAV_MS = "(() => { const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd - n.startTime; })()"
# Scrolls the timeline one animation frame at a time and times the frames. "wheel": 120 px a frame (a
# fast wheel), turning back at either end; "jump": from the top to the bottom in ``steps`` frames (dragging
# the scrollbar), every frame a new stretch of rows.
SCROLL = """async ([mode, steps]) => {
  const list = document.getElementById('tl-list');
  const frames = [];
  let rows = 0, dir = 1, reachedEnd = false;
  list.scrollTop = 0;
  await new Promise(requestAnimationFrame);
  let last = performance.now();
  for (let i = 1; i <= steps; i++) {
    const end = list.scrollHeight - list.clientHeight;
    if (mode === 'jump') list.scrollTop = end * i / steps;
    else {
      if ((dir > 0 && list.scrollTop >= end) || (dir < 0 && list.scrollTop <= 0)) dir = -dir;
      list.scrollTop += dir * 120;
    }
    reachedEnd = reachedEnd || list.scrollTop >= end - 2;
    await new Promise(requestAnimationFrame);
    const now = performance.now();
    frames.push(now - last);
    last = now;
    rows = Math.max(rows, list.querySelectorAll('.tr').length);
  }
  return {frames, rows, reachedEnd};
}"""


def frame_stats(frames: list[float]) -> dict[str, Any]:
    ordered = sorted(frames)
    return {"median_ms": statistics.median(frames), "p95_ms": ordered[int(len(ordered) * 0.95) - 1],
            "max_ms": ordered[-1], "over_50ms": sum(1 for f in frames if f > 50)}


def browse_list(ui: Ui, browser: Any, repeats: int) -> dict[str, Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.goto(f"{ui.base}/runs?token={ui.token}")  # sets the cookie; redirected to /runs
    first = page.evaluate(NAV_MS)  # the first load folds every listed run's journal once (then cached)
    samples = []
    for _ in range(repeats):
        page.goto(f"{ui.base}/runs")
        page.wait_for_selector("tr.run")
        samples.append(page.evaluate(NAV_MS) / 1000)
    rows = page.locator("tr.run").count()
    context.close()
    return {"first_load_s": first / 1000, "load_s": summarize(samples), "rows_shown": rows}


def browse_run(ui: Ui, browser: Any, run_id: str, repeats: int, steps: int) -> dict[str, Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.goto(f"{ui.base}/runs?token={ui.token}")
    loads = []
    result: dict[str, Any] = {}
    for n in range(repeats):
        started = time.perf_counter()
        page.goto(f"{ui.base}/run?id={run_id}")
        page.wait_for_function("() => /^(\\d+) of \\1 shown$/.test(document.getElementById('tl-count').textContent)",
                               timeout=300_000)
        loads.append(time.perf_counter() - started)
        if n == 0:
            result["items"] = int(page.inner_text("#tl-count").split()[0])
    wheel = page.evaluate(SCROLL, ["wheel", steps])
    jump = page.evaluate(SCROLL, ["jump", steps])
    assert jump["reachedEnd"], "the scroll did not reach the end of the timeline"
    context.close()
    result.update({"load_s": summarize(loads), "scroll": frame_stats(wheel["frames"]),
                   "scroll_jump": frame_stats(jump["frames"]), "dom_rows": max(wheel["rows"], jump["rows"])})
    return result


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"machine": machine_info(), "runs": args.runs, "calls": args.calls, "small_calls": args.small_calls,
                           "load_average_before": os.getloadavg()}
    list_store, calls_store = workdir / "list.db", workdir / "calls.db"
    started = time.perf_counter()
    asyncio.run(make_runs(list_store, args.runs))
    res["make_runs_s"] = time.perf_counter() - started
    res["make_call_runs_s"] = asyncio.run(make_call_runs(calls_store, args.calls, args.small_calls))
    res["baseline_dsb_runs_s"] = dsb_runs_seconds(list_store, args.runs, args.repeats)
    res["baseline_engine_runs_s"] = asyncio.run(engine_runs_seconds(list_store, args.runs, args.repeats))

    list_ui, calls_ui = Ui(list_store, workdir), Ui(calls_store, workdir)
    try:
        res["http_runs_page_s"] = summarize([list_ui.timed_get("/runs")[0] for _ in range(args.repeats)])
        res["http_runs_page_200_s"] = summarize([list_ui.timed_get("/runs?per=200")[0] for _ in range(args.repeats)])
        for run_id in ("small", "big"):
            took = [calls_ui.timed_get(f"/api/timeline?id={run_id}") for _ in range(args.repeats)]
            res[f"http_timeline_{run_id}"] = {"seconds": summarize([t for t, _ in took]), "bytes": took[0][1]}
        if args.browser:
            from playwright.sync_api import sync_playwright

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
                try:
                    res["browser_runs_page"] = browse_list(list_ui, browser, args.repeats)
                    for run_id in ("small", "big"):
                        res[f"browser_run_{run_id}"] = browse_run(calls_ui, browser, run_id, args.repeats, args.scroll_steps)
                finally:
                    browser.close()
    finally:
        list_ui.close()
        calls_ui.close()
    res["load_average_after"] = os.getloadavg()
    base = res["baseline_dsb_runs_s"]["median"]
    res["ratios"] = {"http_runs_page_vs_dsb_runs": ratio(res["http_runs_page_s"]["median"], base)}
    if args.browser:
        res["ratios"]["browser_runs_page_vs_dsb_runs"] = ratio(res["browser_runs_page"]["load_s"]["median"], base)
        res["ratios"]["big_vs_small_run_page_load"] = ratio(res["browser_run_big"]["load_s"]["median"],
                                                            res["browser_run_small"]["load_s"]["median"])
        res["ratios"]["big_vs_small_scroll_p95"] = ratio(res["browser_run_big"]["scroll"]["p95_ms"],
                                                         res["browser_run_small"]["scroll"]["p95_ms"])
    return res


def report(res: dict[str, Any]) -> None:
    rows = [
        ["`dsb runs --limit N -o json` (baseline, a process)", fmt(res["baseline_dsb_runs_s"]["median"] * 1000, " ms", 0), "1.0x"],
        ["engine.runs(limit=N), in-process", fmt(res["baseline_engine_runs_s"]["median"] * 1000, " ms", 0),
         fmt(ratio(res["baseline_engine_runs_s"]["median"], res["baseline_dsb_runs_s"]["median"]), "x", 2)],
        ["GET /runs (50 rows) over HTTP", fmt(res["http_runs_page_s"]["median"] * 1000, " ms", 0),
         fmt(res["ratios"]["http_runs_page_vs_dsb_runs"], "x", 2)],
        ["GET /runs?per=200 over HTTP", fmt(res["http_runs_page_200_s"]["median"] * 1000, " ms", 0),
         fmt(ratio(res["http_runs_page_200_s"]["median"], res["baseline_dsb_runs_s"]["median"]), "x", 2)],
    ]
    if "browser_runs_page" in res:
        b = res["browser_runs_page"]
        rows.append(["/runs in Chromium, to the load event", fmt(b["load_s"]["median"] * 1000, " ms", 0),
                     fmt(res["ratios"]["browser_runs_page_vs_dsb_runs"], "x", 2)])
        rows.append(["/runs in Chromium, first load (cold caches)", fmt(b["first_load_s"] * 1000, " ms", 0), ""])
    print(f"load average (1, 5, 15 min) before: {res['load_average_before']}, after: {res['load_average_after']}")
    print_table(f"Runs list of {res['runs']:,} runs", ["what", "median", "vs dsb runs"], rows)
    rows = []
    for run_id in ("small", "big"):
        http = res[f"http_timeline_{run_id}"]
        line = [run_id, fmt(http["seconds"]["median"] * 1000, " ms", 0), fmt(http["bytes"] / 1024, " KiB", 0)]
        if f"browser_run_{run_id}" in res:
            b = res[f"browser_run_{run_id}"]
            s = b["scroll"]
            line += [str(b["items"]), fmt(b["load_s"]["median"] * 1000, " ms", 0), fmt(s["median_ms"], " ms"),
                     fmt(s["p95_ms"], " ms"), fmt(s["max_ms"], " ms"), str(s["over_50ms"]), str(b["dom_rows"])]
        rows.append(line)
    header = ["run", "GET /api/timeline", "size"]
    if "browser_run_big" in res:
        header += ["items", "page loaded", "frame median", "frame p95", "frame max", "frames >50ms", "rows in DOM"]
    print_table(f"Run page: {res['calls']:,} calls vs {res['small_calls']:,} calls (scrolling 120 px a frame)", header, rows)
    if "browser_run_big" in res:
        j = res["browser_run_big"]["scroll_jump"]
        print(f"  {res['calls']:,} calls, scrolled top to bottom: "
              f"median {fmt(j['median_ms'], ' ms')}, p95 {fmt(j['p95_ms'], ' ms')}, max {fmt(j['max_ms'], ' ms')}, "
              f"{j['over_50ms']} over 50 ms")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--small-calls", type=int, default=200,
                        help="the baseline run: long enough to scroll (the page shows about 23 rows)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scroll-steps", type=int, default=300)
    parser.add_argument("--no-browser", dest="browser", action="store_false")
    parser.add_argument("--tmp", default=None, help="where the temp stores go")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "ui_pages.json")
    args = parser.parse_args(argv)
    holder: dict[str, Any] = {}

    def go(workdir: Path) -> dict[str, Any]:
        holder.update(run(args, workdir))
        return holder

    # A home of its own: the local provider's workspaces and snapshots stay out of the user's.
    with tempfile.TemporaryDirectory(prefix="dsb-bench-ui-home-", dir=args.tmp) as home:
        os.environ["DURABLE_SANDBOX_HOME"] = home
        run_in_workdir("ui", args.tmp, go, report, args.out)
    return holder


if __name__ == "__main__":
    main()
